// reference-plugin: a minimal device plugin in Go (grpc-go, the generated v1beta1 stub),
// the same-run yardstick for the Python plugin's figures. It does what a simple plugin
// must: serve its socket, register with the kubelet, list N healthy devices, prefer the
// first free ones, and answer Allocate with the devices' environment variable.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	devices []*api.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select { // the device list never changes: hold the stream until either side ends it
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) GetPreferredAllocation(_ context.Context, r *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	response := &api.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		chosen := append([]string{}, c.MustIncludeDeviceIDs...)
		for _, id := range c.AvailableDeviceIDs {
			if len(chosen) >= int(c.AllocationSize) {
				break
			}
			if !contains(chosen, id) {
				chosen = append(chosen, id)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses,
			&api.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return response, nil
}

func (p *plugin) Allocate(_ context.Context, r *api.AllocateRequest) (*api.AllocateResponse, error) {
	response := &api.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		for _, id := range c.DevicesIds {
			if !p.known(id) {
				return nil, fmt.Errorf("unknown device %q", id)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")}})
	}
	return response, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func (p *plugin) known(id string) bool {
	for _, d := range p.devices {
		if d.ID == id {
			return true
		}
	}
	return false
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func register(kubeletSocket, endpoint, resource string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, kubeletSocket, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: "v1beta1", Endpoint: endpoint, ResourceName: resource,
		Options: &api.DevicePluginOptions{GetPreferredAllocationAvailable: true}})
	return err
}

func main() {
	kubeletSocket := flag.String("kubelet-socket", "/var/lib/kubelet/device-plugins/kubelet.sock", "the kubelet's socket")
	resource := flag.String("resource", "example.com/gpu", "extended resource name")
	count := flag.Int("devices", 2, "how many (healthy) devices to advertise")
	flag.Parse()
	endpoint := "reference-plugin.sock"
	path := filepath.Join(filepath.Dir(*kubeletSocket), endpoint)
	p := &plugin{stop: make(chan struct{})}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &api.Device{ID: fmt.Sprintf("ref-gpu-%d", i), Health: "Healthy"})
	}
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "reference-plugin: cannot listen on %s: %v\n", path, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	if err := register(*kubeletSocket, endpoint, *resource); err != nil {
		fmt.Fprintf(os.Stderr, "reference-plugin: registration failed: %v\n", err)
		os.Exit(1)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	close(p.stop)
	server.Stop()
	_ = os.Remove(path)
}
