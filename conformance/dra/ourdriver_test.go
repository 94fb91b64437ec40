package dra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meta-gpu-k8s/conformance/deviceplugin"
)

// ourDriverName is the name our driver ships with (docs/dra.md); its taint keys live under it.
const ourDriverName = "gpu.meta-gpu-k8s.io"

// ourDriver is our DRA driver (issue 35) started as its unit starts it, `python -m
// gpu_device_plugin dra`, every path from the contract's environment, with a host tree of
// fixture files (or simulated GPUs) and allocationApi dra (the images' default is the device
// plugin, with which the driver exits at once). A wrapper (a file in tests/plugin) prepares the
// process first and then runs the same main with the same arguments; "" for none.
func ourDriver(t *testing.T, wrapper string, args ...string) DriverSpec {
	t.Helper()
	repo, err := deviceplugin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	python, err := deviceplugin.PluginPython(repo)
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if !strings.HasPrefix(a, `"$`) {
			quoted[i] = fmt.Sprintf("%q", a)
		}
	}
	program := "-m gpu_device_plugin"
	if wrapper != "" {
		program = fmt.Sprintf("%q", filepath.Join(repo, "tests", "plugin", wrapper))
	}
	return DriverSpec{Name: ourDriverName,
		Command: fmt.Sprintf("exec %q %s dra --allocation-api dra %s", python, program, strings.Join(quoted, " ")),
		Env:     []string{"PYTHONPATH=" + filepath.Join(repo, "plugin", "src"), "PYTHONDONTWRITEBYTECODE=1"},
		// a Python start on a busy 2-CPU machine takes up to a few seconds
		Within: time.Minute}
}

func fixture(t *testing.T, name string) string {
	repo, err := deviceplugin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(repo, "tests", "plugin", "fixtures", name)
}

// Every check of the leg for our driver on each machine's discovery: the Jetsons from their
// fixture trees (Orin R36 with the toolkit's CSV-mode spec, Orin R39 with the CSV-derived spec,
// Thor's open driver, the Nano), and simulated GPUs shared by several claims on a node that
// serves nvidia.com/gpu through DRA, whose health is flipped through files in the state dir.
func TestOurDriver(t *testing.T) {
	cluster := StartCluster(t)
	type machine struct {
		name   string
		args   []string
		checks []string // nil: every check
	}
	machines := []machine{
		{"simulated", []string{"--device-discovery-strategy", "simulated", "--simulated-gpus", "2",
			"--allocation-api", "both", "--multiple-allocations", "on",
			"--simulated-health-dir", `"$DRA_STATE_DIR"`, "--health-recovery-period", "0"}, nil},
		{"orin-r36", []string{"--host-root", fixture(t, "jetson-agx-orin-r36")}, nil},
		{"orin-r39", []string{"--host-root", fixture(t, "jetson-orin-nano-r39")}, []string{"allocation", "prepare"}},
		{"thor-r39", []string{"--host-root", fixture(t, "jetson-agx-thor-r39")}, []string{"allocation", "prepare"}},
		{"nano", []string{"--host-root", fixture(t, "jetson-nano")}, []string{"allocation", "prepare"}},
		// two L4s from the fake NVML, loaded as pynvml inside the driver's process by a wrapper
		{"nvml", []string{"--device-discovery-strategy", "nvml", "--host-root", fixture(t, "x86-nvidia-580")},
			[]string{"registration", "published", "allocation", "prepare"}},
	}
	wrappers := map[string]string{"nvml": "nvml_dra_driver.py"} // ourDriver's, per machine
	for _, m := range machines {
		spec := ourDriver(t, wrappers[m.name], m.args...)
		t.Run(m.name, func(t *testing.T) {
			for _, check := range Checks {
				if m.checks != nil && !contains(m.checks, check.Name) {
					continue
				}
				t.Run(strings.ReplaceAll(check.Name, " ", "-"), func(t *testing.T) {
					if err := check.Run(session(t, cluster, spec)); err != nil {
						t.Fatal(err)
					}
				})
			}
			if m.name == "simulated" {
				t.Run("gpu-failure", func(t *testing.T) {
					if err := checkGPUFailure(session(t, cluster, spec)); err != nil {
						t.Fatal(err)
					}
				})
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// unhealthyTaint is the device's taint of ours in the published slices, or nil.
func unhealthyTaint(s *Session, device string) (*resourceapi.DeviceTaint, bool, error) {
	devices, _, err := s.Published("publishing")
	if err != nil {
		return nil, false, err
	}
	for _, d := range devices {
		if d.Name != device {
			continue
		}
		for i, taint := range d.Taints {
			if taint.Key == ourDriverName+"/unhealthy" {
				return &d.Taints[i], true, nil
			}
		}
		return nil, true, nil
	}
	return nil, false, nil
}

// checkGPUFailure: a GPU gone unhealthy gets our NoSchedule device taint in its slice, so the
// scheduler's allocator no longer hands it out while the other GPU still is; recovered, the taint
// goes and the allocator hands it out again.
func checkGPUFailure(s *Session) error {
	if _, _, err := s.Published("publishing"); err != nil {
		return err
	}
	healthFile := filepath.Join(s.Layout.StateDir, "sim-gpu-0")
	if err := os.WriteFile(healthFile, []byte("Unhealthy\n"), 0o644); err != nil {
		return err
	}
	var taint *resourceapi.DeviceTaint
	err := waitFor(s.Within, func() (bool, error) {
		got, found, err := unhealthyTaint(s, "gpu-0")
		if err == nil && !found {
			err = fmt.Errorf("device gpu-0 not published")
		}
		taint = got
		return got != nil, err
	})
	if err != nil {
		return s.fail("GPU sim-gpu-0 marked unhealthy: device gpu-0 has no %s/unhealthy taint: %v", ourDriverName, err)
	}
	if taint.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		return s.fail("the unhealthy taint's effect is %q, want NoSchedule", taint.Effect)
	}
	if other, _, err := unhealthyTaint(s, "gpu-1"); err != nil || other != nil {
		return s.fail("the healthy GPU gpu-1 is tainted too (%v, %v)", other, err)
	}
	index := func(i int) string {
		return fmt.Sprintf("device.driver == %q && device.attributes[%q].index == %d", ourDriverName, ourDriverName, i)
	}
	allocates := func(name string, i int) (bool, error) {
		claim, err := s.claim(name, index(i))
		if err != nil {
			return false, err
		}
		results, err := Allocate(context.Background(), s.Cluster.Client, s.Cluster.Node, claim)
		return results != nil, err
	}
	if ok, err := allocates("failed-gpu", 0); err != nil || ok {
		return s.fail("a claim for the unhealthy GPU: allocated %t, error %v; want it refused", ok, err)
	}
	if ok, err := allocates("healthy-gpu", 1); err != nil || !ok {
		return s.fail("a claim for the healthy GPU: allocated %t, error %v; want it allocated", ok, err)
	}
	if err := os.WriteFile(healthFile, []byte("Healthy\n"), 0o644); err != nil {
		return err
	}
	err = waitFor(s.Within, func() (bool, error) {
		got, found, err := unhealthyTaint(s, "gpu-0")
		return found && got == nil, err
	})
	if err != nil {
		return s.fail("GPU sim-gpu-0 healthy again: its taint is still published: %v", err)
	}
	if err := s.Cluster.Client.ResourceV1().ResourceClaims(ClaimNamespace).Delete(context.Background(), "failed-gpu",
		metav1.DeleteOptions{}); err != nil {
		return err
	}
	if ok, err := allocates("recovered-gpu", 0); err != nil || !ok {
		return s.fail("a claim for the recovered GPU: allocated %t, error %v; want it allocated", ok, err)
	}
	return nil
}
