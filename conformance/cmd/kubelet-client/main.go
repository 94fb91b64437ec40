// kubelet-client: the kubelet's own device manager (k8s.io/kubernetes at go.mod's version) serving
// kubelet.sock in a directory, driven as the kubelet drives it, for benchmarking any plugin.
//
// Commands arrive on stdin, one per line; events leave on stdout as JSON lines:
//
//	(start)                 -> {"event":"listening"}
//	(devices reach it)      -> {"event":"registered","resource":R,"unix_ns":T} once, then
//	                           {"event":"devices","count":C,"healthy":H,"unix_ns":T} at each change
//	admit WARMUP COUNT SIZE -> {"event":"admissions","ns":[...]}  (COUNT timed admissions)
//	bulk CALLS BYTES        -> {"event":"bulk","codes":[...]}  (CALLS concurrent Allocates of
//	                           about BYTES each on one grpc-go connection to the plugin's socket)
//	quit                    -> exits
//
// An admission is what the kubelet does for a new pod's container asking for SIZE devices: the
// manager's Allocate (the plugin's GetPreferredAllocation, then Allocate, then the manager's
// checkpoint) and the container's run options; the pod then ends and its devices are freed.
// The manager learns of devices from ListAndWatch and writes its checkpoint each time; the
// client watches that file (inotify) to report registration and device changes at once.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/meta-gpu-k8s/conformance/kubelet"
)

type client struct {
	manager  *kubelet.DeviceManager
	resource string

	outMu sync.Mutex
	out   *json.Encoder

	mu         sync.Mutex
	registered bool
	count      int64
	healthy    int64
	ready      chan struct{} // closed once devices are known
}

func (c *client) emit(v map[string]any) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	_ = c.out.Encode(v)
}

// observe reports the manager's view of the resource when it changed.
func (c *client) observe() {
	count, healthy := c.manager.Capacity(c.resource)
	now := time.Now().UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	if count == 0 || count == c.count && healthy == c.healthy {
		return
	}
	if !c.registered {
		c.registered = true
		c.emit(map[string]any{"event": "registered", "resource": c.resource, "unix_ns": now})
		close(c.ready)
	}
	c.count, c.healthy = count, healthy
	c.emit(map[string]any{"event": "devices", "count": count, "healthy": healthy, "unix_ns": now})
}

func (c *client) watch(watcher *fsnotify.Watcher, checkpoint string) {
	for event := range watcher.Events {
		if event.Name == checkpoint {
			c.observe()
		}
	}
}

func (c *client) admit(warmup, count, size int) {
	select {
	case <-c.ready:
	case <-time.After(10 * time.Second):
		c.emit(map[string]any{"event": "error", "error": "no devices reached the device manager in 10 s"})
		return
	}
	times := make([]int64, 0, count)
	for i := range warmup + count {
		pod := kubelet.NewPod(fmt.Sprintf("bench-%d", i), c.resource, int64(size))
		start := time.Now()
		admission, err := c.manager.Admit(pod, c.resource)
		elapsed := time.Since(start)
		if err != nil {
			c.emit(map[string]any{"event": "error", "error": err.Error()})
			return
		}
		if len(admission.Devices) != size {
			c.emit(map[string]any{"event": "error", "error": fmt.Sprintf("admitted with %v", admission.Devices)})
			return
		}
		c.manager.Release(pod)
		if i >= warmup {
			times = append(times, elapsed.Nanoseconds())
		}
	}
	c.emit(map[string]any{"event": "admissions", "size": size, "ns": times})
}

// pluginSocket: the one socket in the directory that is not the manager's own.
func pluginSocket(dir string) (string, error) {
	found, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return "", err
	}
	var sockets []string
	for _, path := range found {
		if filepath.Base(path) != kubelet.SocketName {
			sockets = append(sockets, path)
		}
	}
	if len(sockets) != 1 {
		return "", fmt.Errorf("want one plugin socket in %s, found %v", dir, sockets)
	}
	return sockets[0], nil
}

// bulk: CALLS concurrent Allocates, each naming enough device IDs to be about BYTES long, on one
// grpc-go connection (as the kubelet holds one per plugin): the server must take them all through
// its flow-control windows. The device manager never sends requests this large, so this dials the
// plugin itself with the same grpc-go the manager links.
func (c *client) bulk(dir string, calls, size int) {
	socket, err := pluginSocket(dir)
	if err != nil {
		c.emit(map[string]any{"event": "error", "error": err.Error()})
		return
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.emit(map[string]any{"event": "error", "error": err.Error()})
		return
	}
	defer conn.Close()
	plugin := api.NewDevicePluginClient(conn)
	codes := make([]string, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := []string{}
			for n := 0; n*24 < size; n++ {
				ids = append(ids, fmt.Sprintf("bulk-%d-device-%011d", i, n))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := plugin.Allocate(ctx, &api.AllocateRequest{
				ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: ids}}},
				grpc.MaxCallSendMsgSize(64<<20))
			codes[i] = status.Code(err).String()
		}()
	}
	wg.Wait()
	c.emit(map[string]any{"event": "bulk", "codes": codes})
}

func main() {
	socketDir := flag.String("socket-dir", "", "directory for kubelet.sock (the plugins' directory)")
	resource := flag.String("resource", "nvidia.com/gpu", "the resource the admissions ask for")
	verbosity := flag.Int("v", 0, "the device manager's log verbosity (0: no log; else to stderr)")
	flag.Parse()
	if *socketDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-client: -socket-dir is required")
		os.Exit(2)
	}
	if *verbosity > 0 {
		var klogFlags flag.FlagSet
		klog.InitFlags(&klogFlags)
		_ = klogFlags.Set("v", strconv.Itoa(*verbosity))
	} else {
		klog.SetLogger(logr.Discard()) // nothing formatted while admissions are timed
	}
	watcher, err := fsnotify.NewWatcher()
	if err == nil {
		err = os.MkdirAll(*socketDir, 0o750)
	}
	if err == nil {
		err = watcher.Add(*socketDir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-client:", err)
		os.Exit(1)
	}
	manager, err := kubelet.StartDeviceManager(*socketDir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-client:", err)
		os.Exit(1)
	}
	c := &client{manager: manager, resource: *resource, out: json.NewEncoder(os.Stdout), ready: make(chan struct{})}
	go c.watch(watcher, filepath.Join(*socketDir, "kubelet_internal_checkpoint"))
	c.emit(map[string]any{"event": "listening", "socket": filepath.Join(*socketDir, kubelet.SocketName)})
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) == 0 {
			continue
		}
		if fields[0] == "quit" {
			break
		}
		if fields[0] == "bulk" && len(fields) == 3 {
			calls, errCalls := strconv.Atoi(fields[1])
			size, errSize := strconv.Atoi(fields[2])
			if errCalls != nil || errSize != nil || calls < 1 || size < 1 {
				c.emit(map[string]any{"event": "error", "error": "bulk CALLS BYTES takes numbers >= 1"})
				continue
			}
			c.bulk(*socketDir, calls, size)
			continue
		}
		if fields[0] != "admit" || len(fields) != 4 {
			c.emit(map[string]any{"event": "error", "error": "unknown command: " + scanner.Text()})
			continue
		}
		var n [3]int
		for i := range n {
			n[i], err = strconv.Atoi(fields[i+1])
			if err != nil || n[i] < 0 || i > 0 && n[i] < 1 {
				n[0] = -1
			}
		}
		if n[0] < 0 {
			c.emit(map[string]any{"event": "error", "error": "admit WARMUP COUNT SIZE takes numbers, COUNT and SIZE >= 1"})
			continue
		}
		c.admit(n[0], n[1], n[2])
	}
	_ = manager.Stop()
	_ = os.Remove(filepath.Join(*socketDir, kubelet.SocketName))
}
