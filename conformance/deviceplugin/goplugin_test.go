package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Fault is one way a plugin can be wrong that the checks must catch.
type Fault string

const (
	NoFault          Fault = ""
	WrongDevice      Fault = "Allocate names another GPU than the one allocated"
	NoReRegistration Fault = "does not register again after a kubelet restart"
	SilentList       Fault = "ListAndWatch never sends"
	DeafHealth       Fault = "health changes never reach ListAndWatch"
)

// goPlugin is a device plugin written here, behaving as ours does (time-sliced replicas
// "<gpu>::<n>", spread by its preferred allocation, NVIDIA_VISIBLE_DEVICES, re-registration when
// kubelet.sock is created anew) apart from one injected fault. Without a fault it must pass every
// check: that is what makes a failed check mean the fault, not the harness.
type goPlugin struct {
	fault    Fault
	gpus     []string
	replicas int

	mu      sync.Mutex
	dir     string
	server  *grpc.Server
	healthy map[string]bool
	changed chan struct{} // closed and replaced at each health change
	stop    context.CancelFunc
	done    chan struct{}
	log     []string

	pluginapi.UnimplementedDevicePluginServer
}

func newGoPlugin(fault Fault, gpus, replicas int) *goPlugin {
	p := &goPlugin{fault: fault, replicas: replicas, healthy: map[string]bool{}, changed: make(chan struct{})}
	for i := range gpus {
		gpu := fmt.Sprintf("go-gpu-%d", i)
		p.gpus = append(p.gpus, gpu)
		p.healthy[gpu] = true
	}
	return p
}

func (p *goPlugin) Model() Model {
	return Model{Resource: "nvidia.com/gpu", GPUs: p.gpus, Replicas: p.replicas, Spreads: true, HandOver: EnvVar,
		RuntimeName: func(gpu string) string { return gpu }, RegisterWithin: 5 * time.Second}
}

func (p *goPlugin) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, fmt.Sprintf(format, args...))
}

func (p *goPlugin) Diagnostics() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log[max(0, len(p.log)-10):], "\n")
}

func (p *goPlugin) socket() string { return filepath.Join(p.dir, "go-plugin.sock") }

func (p *goPlugin) Start(dir string) error {
	ctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	p.dir, p.stop, p.done = dir, cancel, make(chan struct{})
	p.mu.Unlock()
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := watcher.Add(dir); err != nil {
		watcher.Close()
		return err
	}
	if err := p.serveAndRegister(); err != nil {
		watcher.Close()
		return err
	}
	go func() {
		defer close(p.done)
		defer watcher.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case event := <-watcher.Events:
				if event.Name != filepath.Join(dir, "kubelet.sock") || !event.Has(fsnotify.Create) {
					continue
				}
				if p.fault == NoReRegistration {
					p.logf("kubelet.sock created again: not registering (fault)")
					continue
				}
				// kubelet.sock exists from bind(), before listen(): a first dial may be refused
				for try := 1; ; try++ {
					err := p.serveAndRegister()
					if err == nil || try == 100 || ctx.Err() != nil {
						break
					}
					p.logf("registering again (try %d): %v", try, err)
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
	}()
	return nil
}

// serveAndRegister serves on a fresh socket (a new kubelet deleted the old one) and registers.
func (p *goPlugin) serveAndRegister() error {
	p.mu.Lock()
	if p.server != nil {
		p.server.Stop()
	}
	_ = os.Remove(p.socket())
	listener, err := net.Listen("unix", p.socket())
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func(s *grpc.Server) { _ = s.Serve(listener) }(p.server)
	p.mu.Unlock()
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(p.socket()), ResourceName: "nvidia.com/gpu",
		Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}})
	p.logf("registered: %v", err)
	return err
}

func (p *goPlugin) Stop() error {
	p.mu.Lock()
	stop, done, server := p.stop, p.done, p.server
	p.server, p.stop = nil, nil
	p.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	<-done
	if server != nil {
		server.Stop() // closing the listener removes the socket
	}
	if err := os.Remove(p.socket()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (p *goPlugin) SetHealth(gpu string, healthy bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.healthy[gpu]; !ok {
		return fmt.Errorf("no GPU %s", gpu)
	}
	p.healthy[gpu] = healthy
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

func (p *goPlugin) deviceIDs(gpu string) []string {
	if p.replicas < 2 {
		return []string{gpu}
	}
	var ids []string
	for n := range p.replicas {
		ids = append(ids, fmt.Sprintf("%s::%d", gpu, n))
	}
	return ids
}

func (p *goPlugin) list() ([]*pluginapi.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var devices []*pluginapi.Device
	for _, gpu := range p.gpus {
		health := pluginapi.Healthy
		if !p.healthy[gpu] {
			health = pluginapi.Unhealthy
		}
		for _, id := range p.deviceIDs(gpu) {
			devices = append(devices, &pluginapi.Device{ID: id, Health: health})
		}
	}
	return devices, p.changed
}

func (p *goPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *goPlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if p.fault == SilentList {
		<-stream.Context().Done()
		return nil
	}
	for {
		devices, changed := p.list()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		if p.fault == DeafHealth {
			changed = nil // never fires
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation spreads: must-include first, then one at a time from the GPU with the
// most of its replicas still free (ties to the lower index).
func (p *goPlugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	response := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		chosen := slices.Clone(c.MustIncludeDeviceIDs)
		free := map[string][]string{}
		for _, id := range c.AvailableDeviceIDs {
			if !slices.Contains(chosen, id) {
				gpu, _, _ := strings.Cut(id, "::")
				free[gpu] = append(free[gpu], id)
			}
		}
		for len(chosen) < int(c.AllocationSize) {
			best := ""
			for _, gpu := range p.gpus {
				if len(free[gpu]) > 0 && (best == "" || len(free[gpu]) > len(free[best])) {
					best = gpu
				}
			}
			if best == "" {
				break
			}
			slices.Sort(free[best])
			chosen = append(chosen, free[best][0])
			free[best] = free[best][1:]
		}
		response.ContainerResponses = append(response.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return response, nil
}

func (p *goPlugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		var gpus []string
		for _, id := range c.DevicesIds {
			gpu, _, _ := strings.Cut(id, "::")
			if !slices.Contains(p.gpus, gpu) {
				return nil, fmt.Errorf("unknown device %q", id)
			}
			if p.fault == WrongDevice {
				gpu = p.gpus[(slices.Index(p.gpus, gpu)+1)%len(p.gpus)]
			}
			if !slices.Contains(gpus, gpu) {
				gpus = append(gpus, gpu)
			}
		}
		slices.SortFunc(gpus, func(a, b string) int { return slices.Index(p.gpus, a) - slices.Index(p.gpus, b) })
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(gpus, ",")}})
	}
	return response, nil
}

func (p *goPlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, errors.New("not requested by this plugin's options")
}
