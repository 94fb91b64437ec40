package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

// goDriverSwitch makes the test binary run goDriver instead of the tests (TestMain): the harness
// starts the in-test driver through the same command contract as any other.
const goDriverSwitch = "CONFORMANCE_GO_DRA_DRIVER"

// goDriverFault makes the in-test driver wrong in one way, for proving the checks catch it.
const goDriverFault = "CONFORMANCE_GO_DRA_FAULT"

const (
	faultWrongDevice    = "prepare reports another device than the allocated one"
	faultNoCDISpec      = "prepare writes no CDI spec"
	faultStaleCDI       = "unprepare leaves the CDI spec"
	faultNoRepublish    = "slices deleted by the kubelet are not published again"
	faultNoRegistration = "no registration socket"
)

// goDriver is a minimal DRA driver written for the harness, to prove it before ours exists: two
// GPUs in one pool for the node, kept published; registration through plugins_registry; the v1
// DRAPlugin service; a CDI spec per prepared claim, recorded in its state directory so prepare
// and unprepare survive its restarts.
type goDriver struct {
	fault                                                string
	name, node, registryDir, pluginDir, cdiDir, stateDir string
	client                                               kubernetes.Interface

	mu       sync.Mutex
	prepared map[string][]*drapb.Device // claim UID -> what prepare answered

	drapb.UnimplementedDRAPluginServer
	registerapi.UnimplementedRegistrationServer
}

func (d *goDriver) slice() *resourceapi.ResourceSlice {
	devices := []resourceapi.Device{}
	for i, gpu := range []struct{ product, cc, memory string }{{"Harness GPU A", "8.7.0", "16Gi"}, {"Harness GPU B", "7.2.0", "8Gi"}} {
		devices = append(devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":                  {StringValue: ptr.To("gpu")},
				"index":                 {IntValue: ptr.To(int64(i))},
				"productName":           {StringValue: ptr.To(gpu.product)},
				"integrated":            {BoolValue: ptr.To(false)},
				"cudaComputeCapability": {VersionValue: ptr.To(gpu.cc)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse(gpu.memory)},
			},
		})
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: d.node + "-" + d.name},
		Spec: resourceapi.ResourceSliceSpec{Driver: d.name, NodeName: ptr.To(d.node),
			Pool:    resourceapi.ResourcePool{Name: d.node, Generation: 1, ResourceSliceCount: 1},
			Devices: devices},
	}
}

// keepPublished creates the node's slice whenever it is missing (the kubelet deletes slices).
func (d *goDriver) keepPublished(ctx context.Context) {
	slices := d.client.ResourceV1().ResourceSlices()
	want := d.slice()
	for ctx.Err() == nil {
		_, err := slices.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = slices.Create(ctx, want, metav1.CreateOptions{})
			if err == nil && d.fault == faultNoRepublish {
				return
			}
		}
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "publishing:", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (d *goDriver) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: d.name,
		Endpoint: filepath.Join(d.pluginDir, "dra.sock"), SupportedVersions: []string{drapb.DRAPluginService}}, nil
}

func (d *goDriver) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	fmt.Fprintf(os.Stderr, "registration: registered=%v %s\n", s.PluginRegistered, s.Error)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (d *goDriver) statePath() string { return filepath.Join(d.stateDir, "prepared.json") }

func (d *goDriver) save() error {
	data, err := json.Marshal(d.prepared)
	if err != nil {
		return err
	}
	tmp := d.statePath() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.statePath())
}

func (d *goDriver) specPath(claimUID string) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("harness-%s.json", claimUID))
}

func (d *goDriver) prepare(ctx context.Context, c *drapb.Claim) ([]*drapb.Device, error) {
	if devices, ok := d.prepared[c.Uid]; ok {
		return devices, nil // the kubelet may ask again
	}
	claim, err := d.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if string(claim.UID) != c.Uid || claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s: not the allocated claim %s", c.Namespace, c.Name, c.Uid)
	}
	kind := "k8s." + d.name + "/claim"
	type edits struct {
		Env []string `json:"env"`
	}
	type cdiDevice struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	spec := struct {
		Version string      `json:"cdiVersion"`
		Kind    string      `json:"kind"`
		Devices []cdiDevice `json:"devices"`
	}{Version: "0.6.0", Kind: kind}
	var devices []*drapb.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		name := c.Uid + "-" + r.Device
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: edits{Env: []string{"HARNESS_GPU=" + r.Device}}})
		reported := r.Device
		if d.fault == faultWrongDevice {
			reported += "-other"
		}
		devices = append(devices, &drapb.Device{RequestNames: []string{r.Request}, PoolName: r.Pool,
			DeviceName: reported, CdiDeviceIds: []string{kind + "=" + name}})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	tmp := d.specPath(c.Uid) + ".tmp"
	if d.fault != faultNoCDISpec {
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, d.specPath(c.Uid)); err != nil {
			return nil, err
		}
	}
	d.prepared[c.Uid] = devices
	return devices, d.save()
}

func (d *goDriver) NodePrepareResources(ctx context.Context, r *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	response := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, c := range r.Claims {
		devices, err := d.prepare(ctx, c)
		if err != nil {
			response.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Error: err.Error()}
			continue
		}
		response.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Devices: devices}
	}
	return response, nil
}

func (d *goDriver) NodeUnprepareResources(_ context.Context, r *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	response := &drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{}}
	for _, c := range r.Claims {
		result := &drapb.NodeUnprepareResourceResponse{}
		if d.fault == faultStaleCDI {
			// leaves the spec behind
		} else if err := os.Remove(d.specPath(c.Uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
			result.Error = err.Error()
		}
		delete(d.prepared, c.Uid)
		if err := d.save(); err != nil {
			result.Error = err.Error()
		}
		response.Claims[c.Uid] = result
	}
	return response, nil
}

func serve(path string, register func(*grpc.Server)) (*grpc.Server, error) {
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	register(server)
	go func() { _ = server.Serve(listener) }()
	return server, nil
}

// runGoDriver is the in-test driver's main: the contract's environment in, exit 0 on SIGTERM.
func runGoDriver() error {
	env := func(name string) (string, error) {
		if v := os.Getenv(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%s is not set", name)
	}
	d := &goDriver{prepared: map[string][]*drapb.Device{}, fault: os.Getenv(goDriverFault)}
	var kubeconfig, pluginsDir string
	for name, into := range map[string]*string{EnvKubeconfig: &kubeconfig, EnvNodeName: &d.node, EnvDriverName: &d.name,
		EnvRegistryDir: &d.registryDir, EnvPluginsDir: &pluginsDir, EnvCDIDir: &d.cdiDir, EnvStateDir: &d.stateDir} {
		value, err := env(name)
		if err != nil {
			return err
		}
		*into = value
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	if d.client, err = kubernetes.NewForConfig(config); err != nil {
		return err
	}
	if data, err := os.ReadFile(d.statePath()); err == nil {
		if err := json.Unmarshal(data, &d.prepared); err != nil {
			return fmt.Errorf("%s: %w", d.statePath(), err)
		}
	}
	d.pluginDir = filepath.Join(pluginsDir, d.name)
	if err := os.MkdirAll(d.pluginDir, 0o750); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go d.keepPublished(ctx)
	dra, err := serve(filepath.Join(d.pluginDir, "dra.sock"), func(s *grpc.Server) { drapb.RegisterDRAPluginServer(s, d) })
	if err != nil {
		return err
	}
	defer dra.Stop()
	// registration last: the kubelet may call the DRA service as soon as it sees this socket
	if d.fault == faultNoRegistration {
		<-ctx.Done()
		return nil
	}
	registration := filepath.Join(d.registryDir, d.name+"-reg.sock")
	reg, err := serve(registration, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, d) })
	if err != nil {
		return err
	}
	<-ctx.Done()
	reg.Stop()
	_ = os.Remove(registration) // the kubelet's plugin watcher deregisters the driver
	return nil
}
