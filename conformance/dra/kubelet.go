package dra

import (
	"context"
	"os"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// Kubelet is the kubelet's side of DRA: its plugin manager watching RegistryDir for registration
// sockets, handing DRA drivers to its DRA manager, whose claim state lives in StateDir.
type Kubelet struct {
	RegistryDir string
	StateDir    string
	DRA         *dra.Manager

	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}

	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
}

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// StartKubelet starts the DRA manager (which, as at every kubelet start, deletes the node's
// ResourceSlices until drivers publish again) and the plugin manager.
func StartKubelet(cluster *Cluster, registryDir, stateDir string, active []*v1.Pod) (*Kubelet, error) {
	for _, dir := range []string{registryDir, stateDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
	}
	logger := klog.Background().WithName("harness-kubelet")
	manager, err := dra.NewManager(logger, cluster.Client, stateDir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	k := &Kubelet{RegistryDir: registryDir, StateDir: stateDir, DRA: manager, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{}), pods: map[types.UID]*v1.Pod{}}
	for _, pod := range active {
		k.pods[pod.UID] = pod
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return cluster.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	}
	if err := manager.Start(ctx, k.activePods, getNode, sourcesReady{}); err != nil {
		cancel()
		return nil, err
	}
	plugins := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	go func() {
		defer close(k.done)
		plugins.Run(ctx, sourcesReady{}, k.stop)
	}()
	return k, nil
}

func (k *Kubelet) activePods() []*v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	var pods []*v1.Pod
	for _, pod := range k.pods {
		pods = append(pods, pod)
	}
	return pods
}

// Plugins is the DRA manager's registry of drivers (what registration fills).
func (k *Kubelet) Plugins() *draplugin.DRAPluginManager {
	return k.DRA.GetWatcherHandler().(*draplugin.DRAPluginManager)
}

// Prepare is what the kubelet does before starting a pod's containers: the pod is active, its
// claims prepared (NodePrepareResources on their drivers).
func (k *Kubelet) Prepare(ctx context.Context, pod *v1.Pod) error {
	k.mu.Lock()
	k.pods[pod.UID] = pod
	k.mu.Unlock()
	return k.DRA.PrepareResources(ctx, pod)
}

// Unprepare is what the kubelet does once a pod has ended.
func (k *Kubelet) Unprepare(ctx context.Context, pod *v1.Pod) error {
	k.mu.Lock()
	delete(k.pods, pod.UID)
	k.mu.Unlock()
	return k.DRA.UnprepareResources(ctx, pod)
}

// ActivePods is what a restarted kubelet would pass on.
func (k *Kubelet) ActivePods() []*v1.Pod { return k.activePods() }

// Stop stops the plugin manager and the DRA manager, as a stopping kubelet; state stays on disk.
func (k *Kubelet) Stop() {
	close(k.stop)
	k.cancel()
	<-k.done
	if plugins, ok := k.DRA.GetWatcherHandler().(*draplugin.DRAPluginManager); ok && plugins != nil {
		plugins.Stop()
	}
}
