// A DRA driver on Kubernetes' kubelet-plugin helper, doing the work ours does per claim: read the
// claim (the helper does), write a CDI spec for it atomically (temporary file, fsync, rename), record
// it in a checkpoint file the same way, and answer with the CDI device IDs. It publishes N GPUs with
// attributes like ours. The yardstick of bench/dra_bench.py; not a driver for real GPUs.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

type driver struct {
	name, node, cdiDir, state string
	mu                        sync.Mutex
	prepared                  map[types.UID][]string
}

func writeAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("k8s.%s-claim_%s.json", d.name, uid))
}

func (d *driver) saveCheckpoint() error {
	data, err := json.Marshal(d.prepared)
	if err != nil {
		return err
	}
	return writeAtomically(filepath.Join(d.state, "checkpoint.json"), data)
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var result kubeletplugin.PrepareResult
		var devices []map[string]any
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != d.name {
				continue
			}
			id := fmt.Sprintf("k8s.%s/claim=%s-%s", d.name, claim.UID, r.Device)
			devices = append(devices, map[string]any{"name": fmt.Sprintf("%s-%s", claim.UID, r.Device),
				"containerEdits": map[string]any{"env": []string{"GPU_DEVICE=" + r.Device}}})
			result.Devices = append(result.Devices, kubeletplugin.Device{Requests: []string{r.Request},
				PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id}})
		}
		spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.5.0", "kind": fmt.Sprintf("k8s.%s/claim", d.name),
			"devices": devices})
		if err := writeAtomically(d.specPath(claim.UID), spec); err != nil {
			result.Err = err
		} else {
			d.prepared[claim.UID] = []string{claim.Namespace, claim.Name}
			if err := d.saveCheckpoint(); err != nil {
				result.Err = err
			}
		}
		out[claim.UID] = result
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, claim := range claims {
		if err := os.Remove(d.specPath(claim.UID)); err != nil && !os.IsNotExist(err) {
			out[claim.UID] = err
			continue
		}
		delete(d.prepared, claim.UID)
		out[claim.UID] = d.saveCheckpoint()
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", msg, err)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig")
	node := flag.String("node-name", "", "node name")
	name := flag.String("driver-name", "gpu.bench.example.com", "driver name")
	registry := flag.String("plugins-registry-dir", "", "plugin watcher directory")
	pluginDir := flag.String("plugin-dir", "", "DRA socket directory")
	cdiDir := flag.String("cdi-dir", "", "CDI directory")
	state := flag.String("state-dir", "", "checkpoint directory")
	gpus := flag.Int("gpus", 2, "GPUs to publish")
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		panic(err)
	}
	// JSON, as our driver speaks it (client-go's clientset would send protobuf, which the bench's
	// in-memory API server does not read)
	config.ContentType = "application/json"
	config.AcceptContentTypes = "application/json"
	// client-go's default of 5 requests per second would be the figure, not the driver: ours has no limiter
	config.QPS, config.Burst = 1000, 1000
	client := kubernetes.NewForConfigOrDie(config)
	for _, dir := range []string{*registry, *pluginDir, *cdiDir, *state} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			panic(err)
		}
	}
	d := &driver{name: *name, node: *node, cdiDir: *cdiDir, state: *state, prepared: map[types.UID][]string{}}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, d, kubeletplugin.KubeClient(client), kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*name), kubeletplugin.RegistrarDirectoryPath(*registry),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir))
	if err != nil {
		panic(err)
	}
	var devices []resourceapi.Device
	for i := 0; i < *gpus; i++ {
		devices = append(devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":                  {StringValue: ptr.To("gpu")},
				"index":                 {IntValue: ptr.To(int64(i))},
				"productName":           {StringValue: ptr.To("Simulated GPU")},
				"cudaComputeCapability": {VersionValue: ptr.To("8.7.0")},
			},
		})
	}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: devices}}}}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		panic(err)
	}
	<-ctx.Done()
	helper.Stop()
}
