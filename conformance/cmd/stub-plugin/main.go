// stub-plugin: Kubernetes' own device plugin stub (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/
// plugin/v1beta1, the code test/images/sample-device-plugin runs and the kubelet's own tests use)
// serving N healthy devices, as the benchmark's reference. Only its answers are ours: a preferred
// allocation (the first free devices, must-include first) and Allocate's NVIDIA_VISIBLE_DEVICES,
// the same work our plugin does per admission. Its per-call log lines are discarded, as a
// DaemonSet's would go to a file nobody reads while the benchmark runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

func preferred(r *pluginapi.PreferredAllocationRequest, _ map[string]*pluginapi.Device) (*pluginapi.PreferredAllocationResponse, error) {
	response := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		chosen := slices.Clone(c.MustIncludeDeviceIDs)
		for _, id := range c.AvailableDeviceIDs {
			if len(chosen) >= int(c.AllocationSize) {
				break
			}
			if !slices.Contains(chosen, id) {
				chosen = append(chosen, id)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return response, nil
}

func allocate(r *pluginapi.AllocateRequest, devices map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		for _, id := range c.DevicesIds {
			if _, ok := devices[id]; !ok {
				return nil, fmt.Errorf("unknown device %q", id)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")}})
	}
	return response, nil
}

func main() {
	kubeletSocket := flag.String("kubelet-socket", pluginapi.KubeletSocket, "the kubelet's registration socket")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	count := flag.Int("devices", 2, "how many healthy devices to advertise")
	flag.Parse()
	klog.SetLogger(logr.Discard())
	ctx := context.Background()
	var devices []*pluginapi.Device
	for i := range *count {
		devices = append(devices, &pluginapi.Device{ID: fmt.Sprintf("stub-gpu-%d", i), Health: pluginapi.Healthy})
	}
	dir := filepath.Dir(*kubeletSocket)
	stub := plugin.NewDevicePluginStub(klog.Background(), devices, filepath.Join(dir, "stub-plugin.sock"), *resource,
		false, true)
	stub.SetGetPreferredAllocFunc(preferred)
	stub.SetAllocFunc(allocate)
	if err := stub.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "stub-plugin: start:", err)
		os.Exit(1)
	}
	if err := stub.Register(ctx, *kubeletSocket, *resource, ""); err != nil {
		fmt.Fprintln(os.Stderr, "stub-plugin: register:", err)
		os.Exit(1)
	}
	go stub.Watch(ctx, *kubeletSocket, *resource, "") // registers again when a new kubelet.sock appears
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	_ = stub.Stop(klog.Background())
}
