// Package kubelet hosts the kubelet's own device manager and DRA manager (k8s.io/kubernetes at the
// version in go.mod) in a test or a benchmark, as the kubelet drives them: the pods it admits,
// the calls it makes per container, a restart on the same directory.
package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newManagerImpl is the device manager's own constructor. The exported NewManagerImpl fixes the
// socket to /var/lib/kubelet/device-plugins/kubelet.sock; this one takes the path, as upstream's
// own tests use it, so each test and benchmark round gets a directory of its own without root.
// TestNewManagerImplSignature checks this declaration against the source at the pinned version:
// a mismatch would pass the wrong arguments, so a version bump must keep that test green.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node,
	topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// SocketName is the registration socket's name in the manager's directory, as in the kubelet.
const SocketName = "kubelet.sock"

// ContainerName is the one container of the pods NewPod makes.
const ContainerName = "main"

// DeviceManager is the kubelet's device manager serving kubelet.sock in Dir, with the set of
// active pods the kubelet would hand it.
type DeviceManager struct {
	Dir     string
	Manager *devicemanager.ManagerImpl

	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
}

// noTopology is the topology manager of a kubelet with the "none" policy, the default: no NUMA
// hint for any container, so the device manager asks the plugin's preference over all devices.
type noTopology struct{}

func (noTopology) GetAffinity(string, string) topologymanager.TopologyHint {
	return topologymanager.TopologyHint{}
}
func (noTopology) GetPolicy() topologymanager.Policy { return topologymanager.NewNonePolicy() }
func (noTopology) Name() string                      { return "none" }

type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

// StartDeviceManager starts a device manager on dir (made if missing; a checkpoint left there by
// an earlier manager is read, as after a kubelet restart). active lists the pods still running
// from before (nil: none).
func StartDeviceManager(dir string, active []*v1.Pod) (*DeviceManager, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	m, err := newManagerImpl(klog.Background(), filepath.Join(dir, SocketName), nil, noTopology{})
	if err != nil {
		return nil, err
	}
	d := &DeviceManager{Dir: dir, Manager: m, pods: map[types.UID]*v1.Pod{}}
	for _, pod := range active {
		d.pods[pod.UID] = pod
	}
	// sources ready: pods no longer active lose their devices at the next admission, as in a
	// kubelet that has synced with the API server
	if err := m.Start(klog.Background(), d.activePods, allSourcesReady{}, containermap.NewContainerMap(),
		sets.New[string]()); err != nil {
		return nil, fmt.Errorf("device manager start: %w", err)
	}
	return d, nil
}

func (d *DeviceManager) activePods() []*v1.Pod {
	d.mu.Lock()
	defer d.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(d.pods))
	for _, pod := range d.pods {
		pods = append(pods, pod)
	}
	return pods
}

// ActivePods is what a restarted kubelet would pass on: the pods admitted and not released.
func (d *DeviceManager) ActivePods() []*v1.Pod { return d.activePods() }

// Stop stops the registration server and disconnects the plugins, as a stopping kubelet does;
// the directory and its checkpoint stay.
func (d *DeviceManager) Stop() error {
	return d.Manager.Stop(klog.Background())
}

// Capacity is the node status the kubelet would report for resource: capacity (healthy and
// unhealthy devices of a registered plugin) and allocatable (the healthy ones).
func (d *DeviceManager) Capacity(resourceName string) (capacity, allocatable int64) {
	c, a, _ := d.Manager.GetCapacity()
	name := v1.ResourceName(resourceName)
	if q, ok := c[name]; ok {
		capacity = q.Value()
	}
	if q, ok := a[name]; ok {
		allocatable = q.Value()
	}
	return capacity, allocatable
}

// Admission is what the device manager decided for a pod's container.
type Admission struct {
	Pod     *v1.Pod
	Devices []string // the device IDs the manager allocated to the container
	Options *devicemanager.DeviceRunContainerOptions
}

// Admit does what the kubelet does for a new pod's container: the pod becomes active, the
// manager allocates (GetPreferredAllocation and Allocate on the plugin), then reads the run
// options for the container's start. A refused pod is not active.
func (d *DeviceManager) Admit(pod *v1.Pod, resourceName string) (*Admission, error) {
	d.mu.Lock()
	d.pods[pod.UID] = pod
	d.mu.Unlock()
	container := &pod.Spec.Containers[0]
	if err := d.Manager.Allocate(pod, container); err != nil {
		d.forget(pod)
		return nil, err
	}
	options, err := d.Manager.GetDeviceRunContainerOptions(context.Background(), pod, container)
	if err != nil {
		d.forget(pod)
		return nil, err
	}
	return &Admission{Pod: pod, Devices: d.Devices(pod, resourceName), Options: options}, nil
}

// RunOptions reads a running container's options again (what the kubelet does when it starts the
// container anew, e.g. after a kubelet restart: from the checkpoint, without the plugin).
func (d *DeviceManager) RunOptions(pod *v1.Pod) (*devicemanager.DeviceRunContainerOptions, error) {
	return d.Manager.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
}

// Devices lists the device IDs the manager holds for the pod's container.
func (d *DeviceManager) Devices(pod *v1.Pod, resourceName string) []string {
	devices := d.Manager.GetDevices(string(pod.UID), ContainerName)[resourceName]
	return sets.List(sets.KeySet(devices))
}

// Release ends a pod: the manager frees its devices, as the kubelet's next admission would.
func (d *DeviceManager) Release(pod *v1.Pod) {
	d.forget(pod)
	d.Manager.UpdateAllocatedDevices()
}

func (d *DeviceManager) forget(pod *v1.Pod) {
	d.mu.Lock()
	delete(d.pods, pod.UID)
	d.mu.Unlock()
}

// NewPod is a pod with one container asking for count devices of resource (limits, as the API
// server makes requests equal to limits for extended resources).
func NewPod(name, resourceName string, count int64) *v1.Pod {
	quantity := *resource.NewQuantity(count, resource.DecimalSI)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uuid.NewUUID()},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name: ContainerName,
			Resources: v1.ResourceRequirements{
				Limits:   v1.ResourceList{v1.ResourceName(resourceName): quantity},
				Requests: v1.ResourceList{v1.ResourceName(resourceName): quantity},
			},
		}}},
	}
}
