package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"sigs.k8s.io/yaml"
)

// DriverSpec is how to start the driver under test.
type DriverSpec struct {
	Name    string        // the driver name the harness hands it
	Command string        // run by /bin/sh -c
	Env     []string      // more environment
	Within  time.Duration // how long registration and publishing may take (0: a minute)
}

// Session is one driver beside one kubelet, in a directory tree of their own, on a shared cluster.
type Session struct {
	Cluster *Cluster
	Layout  Layout
	Kubelet *Kubelet
	Driver  *Driver
	Within  time.Duration // how long registration and publishing may take
	pods    int
	// replaced is the driver's registration before a restart of the driver
	replaced *draplugin.DRAPlugin
}

// ClaimNamespace holds the claims and pods of the checks.
const ClaimNamespace = "default"

// NewSession starts the kubelet side, then the driver.
func NewSession(cluster *Cluster, root string, spec DriverSpec) (*Session, error) {
	layout, err := NewLayout(root)
	if err != nil {
		return nil, err
	}
	kubelet, err := StartKubelet(cluster, layout.RegistryDir, layout.KubeletDir, nil)
	if err != nil {
		return nil, err
	}
	driver := &Driver{Name: spec.Name, Command: spec.Command, Env: spec.Env, layout: layout, cluster: cluster}
	s := &Session{Cluster: cluster, Layout: layout, Kubelet: kubelet, Driver: driver, Within: spec.Within}
	if s.Within == 0 {
		s.Within = time.Minute
	}
	if err := driver.Start(); err != nil {
		kubelet.Stop()
		return nil, err
	}
	return s, nil
}

// Close stops the driver and the kubelet and removes what the session left in the cluster.
func (s *Session) Close() {
	_ = s.Driver.Stop()
	s.Kubelet.Stop()
	ctx := context.Background()
	client := s.Cluster.Client.ResourceV1()
	_ = client.ResourceClaims(ClaimNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = client.ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + s.Driver.Name})
}

func (s *Session) fail(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if d := strings.TrimSpace(s.Driver.Diagnostics()); d != "" {
		msg += "\ndriver's last output:\n" + d
	}
	return errors.New(msg)
}

func waitFor(within time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("timed out")
			}
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CheckRegistration: the driver's registration socket in plugins_registry is found by the
// kubelet's plugin watcher and the DRA manager takes the driver (after a driver restart: the
// driver's new registration, not the one it left behind).
func CheckRegistration(s *Session) error {
	var plugin *draplugin.DRAPlugin
	err := waitFor(s.Within, func() (bool, error) {
		var err error
		plugin, err = s.Kubelet.Plugins().GetPlugin(s.Driver.Name)
		if err == nil && plugin == s.replaced {
			err = errors.New("only its registration from before the restart")
		}
		return err == nil, err
	})
	if err != nil {
		return s.fail("registration: the kubelet's DRA manager has no driver %s after %v: %v", s.Driver.Name, s.Within, err)
	}
	s.replaced = nil
	return nil
}

// restartDriver stops and starts the driver, so that CheckRegistration then waits for its new
// registration.
func (s *Session) restartDriver() error {
	plugin, err := s.Kubelet.Plugins().GetPlugin(s.Driver.Name)
	if err != nil {
		return err
	}
	if err := s.Driver.Stop(); err != nil {
		return err
	}
	s.replaced = plugin
	return s.Driver.Start()
}

// Published waits for the driver's ResourceSlices for the node: a complete pool (as many slices of
// its newest generation as each says the pool has) with at least one device; it returns the devices.
func (s *Session) Published(what string) ([]resourceapi.Device, string, error) {
	var devices []resourceapi.Device
	var pool string
	err := waitFor(s.Within, func() (bool, error) {
		list, err := s.Cluster.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + s.Driver.Name})
		if err != nil {
			return false, err
		}
		devices, pool = nil, ""
		newest := map[string]int64{}
		for _, slice := range list.Items {
			if slice.Spec.NodeName == nil || *slice.Spec.NodeName != NodeName {
				return false, fmt.Errorf("ResourceSlice %s is not for node %s (nodeName %v)", slice.Name, NodeName, slice.Spec.NodeName)
			}
			newest[slice.Spec.Pool.Name] = max(newest[slice.Spec.Pool.Name], slice.Spec.Pool.Generation)
		}
		if len(newest) != 1 {
			return false, fmt.Errorf("%d pools published, want one for the node", len(newest))
		}
		count := 0
		for _, slice := range list.Items {
			if slice.Spec.Pool.Generation != newest[slice.Spec.Pool.Name] {
				continue
			}
			pool = slice.Spec.Pool.Name
			count++
			if int64(count) > slice.Spec.Pool.ResourceSliceCount {
				return false, fmt.Errorf("pool %s: more slices than its resourceSliceCount %d", pool, slice.Spec.Pool.ResourceSliceCount)
			}
			devices = append(devices, slice.Spec.Devices...)
			if int64(count) == slice.Spec.Pool.ResourceSliceCount && len(devices) > 0 {
				return true, nil
			}
		}
		return false, fmt.Errorf("pool %s incomplete or without devices (%d slices, %d devices)", pool, count, len(devices))
	})
	if err != nil {
		return nil, "", s.fail("%s: no complete ResourceSlice pool of %s for %s after %v: %v", what, s.Driver.Name,
			NodeName, s.Within, err)
	}
	return devices, pool, nil
}

// CheckPublished: the driver publishes its node's devices.
func CheckPublished(s *Session) error {
	_, _, err := s.Published("publishing")
	return err
}

// CheckRepublished: slices deleted by someone else (the kubelet deletes a node's slices when it
// starts, and a driver's when the driver stays away) come back while the driver runs.
func CheckRepublished(s *Session) error {
	before, _, err := s.Published("publishing")
	if err != nil {
		return err
	}
	if err := s.Cluster.Client.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + s.Driver.Name}); err != nil {
		return err
	}
	after, _, err := s.Published("publishing after the slices were deleted")
	if err != nil {
		return err
	}
	if len(after) != len(before) {
		return s.fail("%d devices published again, %d before", len(after), len(before))
	}
	return nil
}

// deviceClass is a class of every device of the driver, as a cluster admin would define it.
func (s *Session) deviceClass() (string, error) {
	name := strings.ReplaceAll(s.Driver.Name, "/", "-")
	_, err := s.Cluster.Client.ResourceV1().DeviceClasses().Create(context.Background(), &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", s.Driver.Name)}}}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	return name, err
}

// claim creates a claim for one device of the driver's class matching the CEL selector.
func (s *Session) claim(name, selector string) (*resourceapi.ResourceClaim, error) {
	class, err := s.deviceClass()
	if err != nil {
		return nil, err
	}
	return s.Cluster.Client.ResourceV1().ResourceClaims(ClaimNamespace).Create(context.Background(), &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}},
		}}}},
	}, metav1.CreateOptions{})
}

func sameLook(a, b resourceapi.Device) bool {
	if len(a.Attributes) != len(b.Attributes) || len(a.Capacity) != len(b.Capacity) {
		return false
	}
	for name, x := range a.Attributes {
		y, ok := b.Attributes[name]
		if !ok || fmt.Sprint(x) != fmt.Sprint(y) {
			return false
		}
	}
	for name, x := range a.Capacity {
		y, ok := b.Capacity[name]
		if !ok || x.Value.Cmp(y.Value) != 0 {
			return false
		}
	}
	return true
}

// allocate allocates a claim selecting a device that looks like want (every attribute and
// capacity the same), checking the allocator's answer; it returns the claim and its result.
func (s *Session) allocate(name string, devices []resourceapi.Device, want resourceapi.Device) (*resourceapi.ResourceClaim, *resourceapi.AllocationResult, error) {
	selector := SelectorFor(s.Driver.Name, want)
	claim, err := s.claim(name, selector)
	if err != nil {
		return nil, nil, err
	}
	results, err := Allocate(context.Background(), s.Cluster.Client, s.Cluster.Node, claim)
	if err != nil {
		return nil, nil, s.fail("allocating claim %s (selector %s): %v", name, selector, err)
	}
	if len(results) != 1 || len(results[0].Devices.Results) != 1 {
		return nil, nil, s.fail("the allocator found no device for claim %s with selector\n  %s\nover %d published devices",
			name, selector, len(devices))
	}
	got := results[0].Devices.Results[0]
	if got.Driver != s.Driver.Name || got.Request != "gpu" {
		return nil, nil, s.fail("claim %s allocated %+v", name, got)
	}
	i := slices.IndexFunc(devices, func(d resourceapi.Device) bool { return d.Name == got.Device })
	if i < 0 || !sameLook(devices[i], want) {
		return nil, nil, s.fail("claim %s selecting %s got device %s, which does not match", name, want.Name, got.Device)
	}
	return claim, &results[0], nil
}

// CheckAllocation: claims with CEL selectors over the published attributes and capacities are
// allocated by the scheduler's allocator to a matching device; a claim nothing matches is not.
func CheckAllocation(s *Session) error {
	devices, _, err := s.Published("publishing")
	if err != nil {
		return err
	}
	for i, want := range []resourceapi.Device{devices[0], devices[len(devices)-1]} {
		if _, _, err := s.allocate(fmt.Sprintf("look-%d", i), devices, want); err != nil {
			return err
		}
	}
	none, err := s.claim("nothing-matches", fmt.Sprintf("device.driver == %q && device.driver != %q",
		s.Driver.Name, s.Driver.Name))
	if err != nil {
		return err
	}
	results, err := Allocate(context.Background(), s.Cluster.Client, s.Cluster.Node, none)
	if err != nil || results != nil {
		return s.fail("a claim no device matches: allocator answered %v, %v; want nothing, no error", results, err)
	}
	return nil
}

// podFor is a pod whose one container uses the claim, as the kubelet sees it.
func (s *Session) podFor(claim *resourceapi.ResourceClaim) *v1.Pod {
	s.pods++
	name := claim.Name
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", s.pods), Namespace: ClaimNamespace, UID: uuid.NewUUID()},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
			Containers:     []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
}

// scheduled allocates a claim for the first published device and reserves it for a new pod, as
// the scheduler does before binding the pod to the node.
func (s *Session) scheduled(name string) (*v1.Pod, *resourceapi.AllocationResult, error) {
	devices, _, err := s.Published("publishing")
	if err != nil {
		return nil, nil, err
	}
	claim, result, err := s.allocate(name, devices, devices[0])
	if err != nil {
		return nil, nil, err
	}
	pod := s.podFor(claim)
	claim.Status.Allocation = result
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := s.Cluster.Client.ResourceV1().ResourceClaims(ClaimNamespace).UpdateStatus(context.Background(), claim,
		metav1.UpdateOptions{}); err != nil {
		return nil, nil, err
	}
	return pod, result, nil
}

// cdiDevices lists the fully qualified CDI device names the specs in dir define.
func cdiDevices(dir string) (map[string]bool, error) {
	names := map[string]bool{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); e.IsDir() || ext != ".json" && ext != ".yaml" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		var spec struct {
			Kind    string `json:"kind"`
			Devices []struct {
				Name string `json:"name"`
			} `json:"devices"`
		}
		if err := yaml.Unmarshal(data, &spec); err != nil {
			return nil, fmt.Errorf("CDI spec %s: %w", e.Name(), err)
		}
		for _, d := range spec.Devices {
			names[spec.Kind+"="+d.Name] = true
		}
	}
	return names, nil
}

// prepared checks what the kubelet holds for the pod's container after prepare: CDI devices,
// each defined by a spec in the CDI directory, for exactly the allocated device.
func (s *Session) prepared(pod *v1.Pod, result *resourceapi.AllocationResult) ([]string, error) {
	info, err := s.Kubelet.DRA.GetResources(pod, &pod.Spec.Containers[0])
	if err != nil {
		return nil, s.fail("the kubelet's resources for the prepared pod: %v", err)
	}
	var ids []string
	for _, d := range info.CDIDevices {
		ids = append(ids, d.Name)
	}
	if len(ids) == 0 {
		return nil, s.fail("NodePrepareResources gave the container no CDI device")
	}
	defined, err := cdiDevices(s.Layout.CDIDir)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if !defined[id] {
			return nil, s.fail("CDI device %s given to the container is in no spec under %s (defined: %v)", id,
				s.Layout.CDIDir, defined)
		}
	}
	claims, err := s.Kubelet.DRA.GetContainerClaimInfos(pod, &pod.Spec.Containers[0])
	if err != nil {
		return nil, err
	}
	want := result.Devices.Results[0]
	for _, claim := range claims {
		for driver, state := range claim.DriverState {
			for _, d := range state.Devices {
				if driver != want.Driver || d.PoolName != want.Pool || d.DeviceName != want.Device ||
					!slices.Contains(d.RequestNames, want.Request) {
					return nil, s.fail("NodePrepareResources reported device %s/%s/%s for requests %v; the claim is "+
						"allocated %s/%s/%s for request %s", driver, d.PoolName, d.DeviceName, d.RequestNames,
						want.Driver, want.Pool, want.Device, want.Request)
				}
			}
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// unprepared checks the claim's CDI devices are gone and the kubelet holds nothing for the pod,
// then deletes the claim.
func (s *Session) unprepared(pod *v1.Pod, ids []string) error {
	defined, err := cdiDevices(s.Layout.CDIDir)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if defined[id] {
			return s.fail("CDI device %s is still defined under %s after NodeUnprepareResources", id, s.Layout.CDIDir)
		}
	}
	if s.Kubelet.DRA.PodMightNeedToUnprepareResources(pod.UID) {
		return s.fail("the kubelet still holds prepared claims for the pod after unprepare")
	}
	// the pod is gone: its claim goes too (the resourceclaim controller's part), freeing the device
	return s.Cluster.Client.ResourceV1().ResourceClaims(ClaimNamespace).Delete(context.Background(),
		*pod.Spec.ResourceClaims[0].ResourceClaimName, metav1.DeleteOptions{})
}

// CheckPrepare: a claim allocated and reserved for a pod is prepared through the kubelet's DRA
// manager (NodePrepareResources), the container gets CDI devices the driver's specs define, and
// unprepare (NodeUnprepareResources) takes them away again.
func CheckPrepare(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	pod, result, err := s.scheduled("prepare")
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := s.Kubelet.Prepare(ctx, pod); err != nil {
		return s.fail("prepare: %v", err)
	}
	ids, err := s.prepared(pod, result)
	if err != nil {
		return err
	}
	if err := s.Kubelet.Unprepare(ctx, pod); err != nil {
		return s.fail("unprepare: %v", err)
	}
	return s.unprepared(pod, ids)
}

// CheckDriverRestart: the driver restarts while a pod runs with a prepared claim; it registers
// again, the claim is unprepared through it, and a new claim is prepared.
func CheckDriverRestart(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	pod, result, err := s.scheduled("before-restart")
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := s.Kubelet.Prepare(ctx, pod); err != nil {
		return s.fail("prepare: %v", err)
	}
	ids, err := s.prepared(pod, result)
	if err != nil {
		return err
	}
	if err := s.restartDriver(); err != nil {
		return err
	}
	if err := CheckRegistration(s); err != nil {
		return err
	}
	if _, _, err := s.Published("publishing after a driver restart"); err != nil {
		return err
	}
	if err := s.Kubelet.Unprepare(ctx, pod); err != nil {
		return s.fail("unprepare after a driver restart: %v", err)
	}
	if err := s.unprepared(pod, ids); err != nil {
		return err
	}
	return CheckPrepare(s)
}

// CheckKubeletRestart: the kubelet restarts while a pod runs with a prepared claim (its new DRA
// manager deletes the node's slices; its plugin watcher finds the driver's socket again); the
// driver publishes again, the container's CDI devices come from the kubelet's checkpoint, and
// the claim is unprepared through the new kubelet.
func CheckKubeletRestart(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	pod, result, err := s.scheduled("kubelet-restart")
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := s.Kubelet.Prepare(ctx, pod); err != nil {
		return s.fail("prepare: %v", err)
	}
	ids, err := s.prepared(pod, result)
	if err != nil {
		return err
	}
	active := s.Kubelet.ActivePods()
	s.Kubelet.Stop()
	restarted, err := StartKubelet(s.Cluster, s.Layout.RegistryDir, s.Layout.KubeletDir, active)
	if err != nil {
		return err
	}
	s.Kubelet = restarted
	if err := CheckRegistration(s); err != nil {
		return err
	}
	if _, _, err := s.Published("publishing after a kubelet restart"); err != nil {
		return err
	}
	again, err := s.prepared(pod, result)
	if err != nil {
		return err
	}
	if !slices.Equal(again, ids) {
		return s.fail("after the kubelet restart the container gets CDI devices %v, before %v", again, ids)
	}
	if err := s.Kubelet.Unprepare(ctx, pod); err != nil {
		return s.fail("unprepare after a kubelet restart: %v", err)
	}
	return s.unprepared(pod, ids)
}

// Checks is every check, each run on a fresh session.
var Checks = []struct {
	Name string
	Run  func(*Session) error
}{
	{"registration", CheckRegistration},
	{"published", CheckPublished},
	{"republished", CheckRepublished},
	{"allocation", CheckAllocation},
	{"prepare", CheckPrepare},
	{"driver restart", CheckDriverRestart},
	{"kubelet restart", CheckKubeletRestart},
}
