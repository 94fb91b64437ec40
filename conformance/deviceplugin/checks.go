package deviceplugin

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/meta-gpu-k8s/conformance/kubelet"
)

// Session is one plugin beside one device manager in a directory of their own.
type Session struct {
	Dir     string
	Plugin  Subject
	Manager *kubelet.DeviceManager
	model   Model
	pods    int
}

// NewSession starts a device manager in dir, then the plugin.
func NewSession(dir string, plugin Subject) (*Session, error) {
	manager, err := kubelet.StartDeviceManager(dir, nil)
	if err != nil {
		return nil, err
	}
	s := &Session{Dir: dir, Plugin: plugin, Manager: manager, model: plugin.Model()}
	if err := plugin.Start(dir); err != nil {
		_ = manager.Stop()
		return nil, fmt.Errorf("plugin did not start: %w", err)
	}
	return s, nil
}

// Close stops the plugin, then the manager.
func (s *Session) Close() {
	_ = s.Plugin.Stop()
	_ = s.Manager.Stop()
}

// Check is one behaviour the kubelet relies on.
type Check struct {
	Name string
	Run  func(*Session) error
}

// Checks is every check, in the order the tests run them on a fresh session each.
var Checks = []Check{
	{"registration", CheckRegistration},
	{"admission", CheckAdmission},
	{"preferred allocation", CheckPreferredAllocation},
	{"health", CheckHealth},
	{"kubelet restart", CheckKubeletRestart},
	{"plugin restart", CheckPluginRestart},
}

// waitFor polls cond until it holds or within passes; the error carries cond's last reason.
func waitFor(within time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New(why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Session) fail(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if d := strings.TrimSpace(s.Plugin.Diagnostics()); d != "" {
		msg += "\nplugin's last output:\n" + d
	}
	return errors.New(msg)
}

// waitCapacity waits until the manager reports capacity and allocatable for the resource.
func (s *Session) waitCapacity(what string, capacity, allocatable int64) error {
	var c, a int64
	err := waitFor(s.model.RegisterWithin, func() (bool, string) {
		c, a = s.Manager.Capacity(s.model.Resource)
		return c == capacity && a == allocatable, ""
	})
	if err != nil {
		return s.fail("%s: the device manager reports %s capacity %d, allocatable %d after %v; want %d, %d",
			what, s.model.Resource, c, a, s.model.RegisterWithin, capacity, allocatable)
	}
	return nil
}

func (s *Session) newPod(count int64) *v1.Pod {
	s.pods++
	return kubelet.NewPod(fmt.Sprintf("pod-%d", s.pods), s.model.Resource, count)
}

// admit admits a pod asking for count devices and checks the hand-over of what it got.
func (s *Session) admit(count int64) (*kubelet.Admission, error) {
	admission, err := s.Manager.Admit(s.newPod(count), s.model.Resource)
	if err != nil {
		return nil, err
	}
	if int64(len(admission.Devices)) != count {
		return nil, s.fail("a pod asking for %d devices was admitted with %v", count, admission.Devices)
	}
	if err := s.model.checkHandOver(admission.Devices, admission.Options); err != nil {
		return nil, s.fail("%v", err)
	}
	return admission, nil
}

// fill admits one-device pods until the manager refuses; it returns them, each device once.
func (s *Session) fill() ([]*kubelet.Admission, error) {
	var admitted []*kubelet.Admission
	held := map[string]bool{}
	for range s.model.Devices() + 1 {
		admission, err := s.admit(1)
		if err != nil {
			if strings.Contains(err.Error(), "requested number of devices unavailable") {
				return admitted, nil
			}
			return admitted, err
		}
		device := admission.Devices[0]
		if held[device] {
			return admitted, s.fail("device %s was allocated to two running pods", device)
		}
		held[device] = true
		admitted = append(admitted, admission)
	}
	return admitted, s.fail("the manager admitted %d one-device pods on %d devices", len(admitted), s.model.Devices())
}

func (s *Session) releaseAll(admitted []*kubelet.Admission) {
	for _, a := range admitted {
		s.Manager.Release(a.Pod)
	}
}

// CheckRegistration: the plugin registers and its whole device list reaches the manager.
func CheckRegistration(s *Session) error {
	n := int64(s.model.Devices())
	return s.waitCapacity("registration", n, n)
}

// CheckAdmission: every device can be admitted once, each container gets exactly its devices'
// hand-over, the manager refuses once none is left, and a released device is admitted again.
func CheckAdmission(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	admitted, err := s.fill()
	if err != nil {
		return err
	}
	if len(admitted) != s.model.Devices() {
		return s.fail("only %d of %d devices could be admitted", len(admitted), s.model.Devices())
	}
	s.releaseAll(admitted)
	if s.model.Devices() > 1 {
		// released devices are admitted again; a container asking for two gets two, in one hand-over
		two, err := s.admit(2)
		if err != nil {
			return s.fail("after release, a two-device pod: %v", err)
		}
		s.Manager.Release(two.Pod)
	}
	again, err := s.admit(1)
	if err != nil {
		return s.fail("after release, admission failed: %v", err)
	}
	s.Manager.Release(again.Pod)
	return nil
}

// CheckPreferredAllocation: with time-sliced replicas, the plugin's preferred allocation decides
// which replica a pod gets (the manager alone picks from a set, in no order). One-device pods
// spread over the GPUs: the first round takes one replica of every GPU, the second another.
// A manager ignoring the plugin's choice passes this by chance with p < 0.01 on 8 GPUs x 4.
func CheckPreferredAllocation(s *Session) error {
	if s.model.Replicas < 2 || !s.model.Spreads || len(s.model.GPUs) < 2 {
		return fmt.Errorf("preferred allocation: needs a plugin with time-slicing on several GPUs, spreading")
	}
	if err := CheckRegistration(s); err != nil {
		return err
	}
	var admitted []*kubelet.Admission
	defer func() { s.releaseAll(admitted) }()
	for round := 1; round <= 2; round++ {
		perGPU := map[string]int{}
		for range s.model.GPUs {
			a, err := s.admit(1)
			if err != nil {
				return err
			}
			admitted = append(admitted, a)
		}
		for _, a := range admitted {
			perGPU[s.model.GPUOf(a.Devices[0])]++
		}
		for _, gpu := range s.model.GPUs {
			if perGPU[gpu] != round {
				return s.fail("after %d one-device pods per GPU the GPUs hold %v: the preferred allocation "+
					"(spread over GPUs) was not what the manager allocated", round, perGPU)
			}
		}
	}
	return nil
}

// CheckHealth: a GPU marked unhealthy leaves allocatable (with all its replicas) but not capacity,
// no pod is admitted to it, and it comes back when healthy again.
func CheckHealth(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	n := int64(s.model.Devices())
	replicas := int64(max(1, s.model.Replicas))
	sick := s.model.GPUs[len(s.model.GPUs)-1]
	if err := s.Plugin.SetHealth(sick, false); err != nil {
		return err
	}
	if err := s.waitCapacity(fmt.Sprintf("GPU %s unhealthy", sick), n, n-replicas); err != nil {
		return err
	}
	admitted, err := s.fill()
	defer s.releaseAll(admitted)
	if err != nil {
		return err
	}
	for _, a := range admitted {
		if s.model.GPUOf(a.Devices[0]) == sick {
			return s.fail("a pod was admitted to %s of the unhealthy GPU %s", a.Devices[0], sick)
		}
	}
	if int64(len(admitted)) != n-replicas {
		return s.fail("%d pods admitted with GPU %s unhealthy, want %d", len(admitted), sick, n-replicas)
	}
	if err := s.Plugin.SetHealth(sick, true); err != nil {
		return err
	}
	// allocatable counts healthy devices, held or not
	return s.waitCapacity(fmt.Sprintf("GPU %s healthy again", sick), n, n)
}

// CheckKubeletRestart: the kubelet restarts (its manager stops; a new one on the same directory
// removes every socket there, reads the checkpoint and serves kubelet.sock anew). The plugin
// registers again; the running pod keeps its devices and hand-over from the checkpoint; no new
// pod gets its device.
func CheckKubeletRestart(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	running, err := s.admit(1)
	if err != nil {
		return err
	}
	if err := s.Manager.Stop(); err != nil {
		return err
	}
	restarted, err := kubelet.StartDeviceManager(s.Dir, []*v1.Pod{running.Pod})
	if err != nil {
		return err
	}
	s.Manager = restarted
	if got := restarted.Devices(running.Pod, s.model.Resource); !slices.Equal(got, running.Devices) {
		return s.fail("after the restart the checkpoint gives the running pod %v, it held %v", got, running.Devices)
	}
	options, err := restarted.RunOptions(running.Pod)
	if err != nil {
		return s.fail("after the restart the running pod's run options: %v", err)
	}
	if err := s.model.checkHandOver(running.Devices, options); err != nil {
		return s.fail("after the restart, from the checkpoint: %v", err)
	}
	n := int64(s.model.Devices())
	if err := s.waitCapacity("registration after a kubelet restart", n, n); err != nil {
		return err
	}
	admitted, err := s.fill()
	defer s.releaseAll(admitted)
	if err != nil {
		return err
	}
	for _, a := range admitted {
		if a.Devices[0] == running.Devices[0] {
			return s.fail("after the restart %s went to a new pod while the running pod holds it", a.Devices[0])
		}
	}
	if len(admitted) != s.model.Devices()-1 {
		return s.fail("after the restart %d pods admitted beside the running one, want %d", len(admitted), s.model.Devices()-1)
	}
	s.Manager.Release(running.Pod)
	return nil
}

// CheckPluginRestart: the plugin stops (its devices stay in capacity, none allocatable, for the
// manager's grace period), starts again and registers; admissions work again.
func CheckPluginRestart(s *Session) error {
	if err := CheckRegistration(s); err != nil {
		return err
	}
	n := int64(s.model.Devices())
	if err := s.Plugin.Stop(); err != nil {
		return err
	}
	if err := s.waitCapacity("plugin stopped", n, 0); err != nil {
		return err
	}
	if _, err := s.Manager.Admit(s.newPod(1), s.model.Resource); err == nil {
		return s.fail("a pod was admitted while the plugin was stopped")
	}
	if err := s.Plugin.Start(s.Dir); err != nil {
		return fmt.Errorf("plugin did not start again: %w", err)
	}
	if err := s.waitCapacity("registration after a plugin restart", n, n); err != nil {
		return err
	}
	a, err := s.admit(1)
	if err != nil {
		return err
	}
	s.Manager.Release(a.Pod)
	return nil
}
