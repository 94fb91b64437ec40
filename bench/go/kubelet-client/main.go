// kubelet-client: the device manager's side of the device plugin API, as the kubelet
// (Go, grpc-go) calls it, for benchmarking any plugin on its own socket.
//
// It serves Registration on <socket-dir>/kubelet.sock. Inside Register it dials the
// plugin back and asks for its options (the kubelet does both before answering), then
// keeps a ListAndWatch stream open. Commands arrive on stdin, one per line; events and
// results leave on stdout as JSON lines:
//
//	admit WARMUP COUNT SIZE  -> {"event":"admissions","ns":[...]}  (COUNT timed admissions)
//	bulk CALLS BYTES         -> {"event":"bulk","codes":[...]}  (CALLS concurrent Allocates of
//	                            about BYTES each on the one connection, 20 s deadline; their status codes)
//	quit                     -> exits
//
// An admission is GetPreferredAllocation then Allocate for one container of SIZE
// devices, on the kubelet's one connection, without deadlines (the kubelet sets none).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type endpoint struct {
	conn   *grpc.ClientConn
	client api.DevicePluginClient
	mu     sync.Mutex
	health map[string]string
}

type kubelet struct {
	api.UnimplementedRegistrationServer
	socketDir string
	out       *json.Encoder
	outMu     sync.Mutex
	mu        sync.Mutex
	current   *endpoint
	ready     chan struct{} // closed at the first device list of a registration
}

func (k *kubelet) emit(v map[string]interface{}) {
	k.outMu.Lock()
	defer k.outMu.Unlock()
	_ = k.out.Encode(v)
}

func dial(path string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return grpc.DialContext(ctx, path, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
}

func (k *kubelet) Register(ctx context.Context, r *api.RegisterRequest) (*api.Empty, error) {
	if r.Version != "v1beta1" {
		return nil, fmt.Errorf("unsupported version %q", r.Version)
	}
	conn, err := dial(filepath.Join(k.socketDir, r.Endpoint))
	if err != nil {
		return nil, fmt.Errorf("failed to dial device plugin: %v", err)
	}
	client := api.NewDevicePluginClient(conn)
	options, err := client.GetDevicePluginOptions(context.Background(), &api.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	ep := &endpoint{conn: conn, client: client, health: map[string]string{}}
	ready := make(chan struct{})
	k.mu.Lock()
	if k.current != nil {
		k.current.conn.Close()
	}
	k.current, k.ready = ep, ready
	k.mu.Unlock()
	k.emit(map[string]interface{}{"event": "registered", "resource": r.ResourceName, "endpoint": r.Endpoint,
		"preferred": options.GetPreferredAllocationAvailable, "unix_ns": time.Now().UnixNano()})
	go k.watch(ep, ready)
	return &api.Empty{}, nil
}

func (k *kubelet) watch(ep *endpoint, ready chan struct{}) {
	stream, err := ep.client.ListAndWatch(context.Background(), &api.Empty{})
	if err != nil {
		k.emit(map[string]interface{}{"event": "stream_error", "error": err.Error()})
		return
	}
	first := true
	for {
		response, err := stream.Recv()
		if err != nil {
			k.emit(map[string]interface{}{"event": "stream_ended", "error": err.Error()})
			return
		}
		healthy := 0
		ep.mu.Lock()
		ep.health = map[string]string{}
		for _, d := range response.Devices {
			ep.health[d.ID] = d.Health
			if d.Health == "Healthy" {
				healthy++
			}
		}
		ep.mu.Unlock()
		k.emit(map[string]interface{}{"event": "devices", "count": len(response.Devices), "healthy": healthy,
			"unix_ns": time.Now().UnixNano()})
		if first {
			close(ready)
			first = false
		}
	}
}

func (ep *endpoint) healthy() []string {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ids := []string{}
	for id, h := range ep.health {
		if h == "Healthy" {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// admit: what the device manager does for one container: the plugin's preferred choice
// among the free healthy devices (a hint, topped up if short), then Allocate.
func (ep *endpoint) admit(size int) error {
	available := ep.healthy()
	if len(available) < size {
		return fmt.Errorf("%d healthy devices, %d requested", len(available), size)
	}
	preferred, err := ep.client.GetPreferredAllocation(context.Background(), &api.PreferredAllocationRequest{
		ContainerRequests: []*api.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: available, AllocationSize: int32(size)}}})
	if err != nil {
		return err
	}
	chosen := []string{}
	if len(preferred.ContainerResponses) > 0 {
		chosen = append(chosen, preferred.ContainerResponses[0].DeviceIDs...)
	}
	for _, id := range available {
		if len(chosen) >= size {
			break
		}
		if !contains(chosen, id) {
			chosen = append(chosen, id)
		}
	}
	response, err := ep.client.Allocate(context.Background(), &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: chosen[:size]}}})
	if err != nil {
		return err
	}
	if len(response.ContainerResponses) != 1 {
		return errors.New("Allocate answered for the wrong number of containers")
	}
	return nil
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (k *kubelet) run(line string) bool {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return true
	}
	switch fields[0] {
	case "quit":
		return false
	case "admit":
		numbers := make([]int, 3)
		for i := range numbers {
			if len(fields) != 4 {
				break
			}
			numbers[i], _ = strconv.Atoi(fields[i+1])
		}
		k.admit(numbers[0], numbers[1], numbers[2])
	case "bulk":
		calls, size := 0, 0
		if len(fields) == 3 {
			calls, _ = strconv.Atoi(fields[1])
			size, _ = strconv.Atoi(fields[2])
		}
		k.bulk(calls, size)
	default:
		k.emit(map[string]interface{}{"event": "error", "error": "unknown command " + fields[0]})
	}
	return true
}

func (k *kubelet) admit(warmup, count, size int) {
	k.mu.Lock()
	ep, ready := k.current, k.ready
	k.mu.Unlock()
	if ep == nil || size < 1 || count < 1 {
		k.emit(map[string]interface{}{"event": "error", "error": "admit WARMUP COUNT SIZE needs a registered plugin"})
		return
	}
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		k.emit(map[string]interface{}{"event": "error", "error": "no device list from ListAndWatch in 10 s"})
		return
	}
	for i := 0; i < warmup; i++ {
		if err := ep.admit(size); err != nil {
			k.emit(map[string]interface{}{"event": "error", "error": err.Error()})
			return
		}
	}
	times := make([]int64, 0, count)
	for i := 0; i < count; i++ {
		start := time.Now()
		if err := ep.admit(size); err != nil {
			k.emit(map[string]interface{}{"event": "error", "error": err.Error()})
			return
		}
		times = append(times, time.Since(start).Nanoseconds())
	}
	k.emit(map[string]interface{}{"event": "admissions", "size": size, "ns": times})
}

// bulk: CALLS concurrent Allocates, each naming enough device IDs to be about BYTES long, on the
// kubelet's one connection: the server must take them all through its flow-control windows.
func (k *kubelet) bulk(calls, size int) {
	k.mu.Lock()
	ep := k.current
	k.mu.Unlock()
	if ep == nil || calls < 1 || size < 1 {
		k.emit(map[string]interface{}{"event": "error", "error": "bulk CALLS BYTES needs a registered plugin"})
		return
	}
	codes := make([]string, calls)
	var wg sync.WaitGroup
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ids := []string{}
			for n := 0; n*24 < size; n++ {
				ids = append(ids, fmt.Sprintf("bulk-%d-device-%011d", i, n))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := ep.client.Allocate(ctx, &api.AllocateRequest{
				ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: ids}}},
				grpc.MaxCallSendMsgSize(64<<20))
			codes[i] = status.Code(err).String()
		}(i)
	}
	wg.Wait()
	k.emit(map[string]interface{}{"event": "bulk", "codes": codes})
}

func main() {
	socketDir := flag.String("socket-dir", "", "directory for kubelet.sock (the plugins' directory)")
	flag.Parse()
	if *socketDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-client: -socket-dir is required")
		os.Exit(2)
	}
	path := filepath.Join(*socketDir, "kubelet.sock")
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-client: cannot listen on %s: %v\n", path, err)
		os.Exit(1)
	}
	k := &kubelet{socketDir: *socketDir, out: json.NewEncoder(os.Stdout)}
	server := grpc.NewServer()
	api.RegisterRegistrationServer(server, k)
	go func() { _ = server.Serve(listener) }()
	k.emit(map[string]interface{}{"event": "listening", "socket": path})
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() && k.run(scanner.Text()) {
	}
	server.Stop()
	_ = os.Remove(path)
}
