package dra

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// EnvDriverCommand names a DRA driver command to check beside the in-test driver (README.md).
const EnvDriverCommand = "CONFORMANCE_DRA_DRIVER"

// EnvDriverUnderTestName is the driver name handed to that command (default below).
const EnvDriverUnderTestName = "CONFORMANCE_DRA_DRIVER_NAME"

func TestMain(m *testing.M) {
	if os.Getenv(goDriverSwitch) == "1" {
		if err := runGoDriver(); err != nil {
			fmt.Fprintln(os.Stderr, "go driver:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// goDriverSpec starts this test binary as the in-test driver, with a fault or none.
func goDriverSpec(self, fault string) DriverSpec {
	return DriverSpec{Name: "gpu.harness.example.com", Command: fmt.Sprintf("exec %q", self),
		Env: []string{goDriverSwitch + "=1", goDriverFault + "=" + fault}, Within: 15 * time.Second}
}

func drivers(t *testing.T) []DriverSpec {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	specs := []DriverSpec{goDriverSpec(self, "")}
	if command := os.Getenv(EnvDriverCommand); command != "" {
		name := os.Getenv(EnvDriverUnderTestName)
		if name == "" {
			name = "gpu.meta-gpu-k8s.example.com"
		}
		specs = append(specs, DriverSpec{Name: name, Command: command})
	}
	return specs
}

func session(t *testing.T, cluster *Cluster, spec DriverSpec) *Session {
	t.Helper()
	root, err := os.MkdirTemp("", "dra-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	s, err := NewSession(cluster, root, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// One API server for the whole run (it takes seconds to start); a fresh kubelet side and driver
// per check. The in-test driver passes every check, and each broken variant of it fails the
// check that names its fault: a check failing for another driver then means that driver.
func TestDRA(t *testing.T) {
	cluster := StartCluster(t)
	for _, spec := range drivers(t) {
		t.Run(spec.Name, func(t *testing.T) {
			for _, check := range Checks {
				t.Run(strings.ReplaceAll(check.Name, " ", "-"), func(t *testing.T) {
					if err := check.Run(session(t, cluster, spec)); err != nil {
						t.Fatal(err)
					}
				})
			}
		})
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	broken := []struct {
		fault string
		check func(*Session) error
		says  string
	}{
		{faultNoRegistration, CheckRegistration, "registration: the kubelet's DRA manager has no driver"},
		{faultNoRepublish, CheckRepublished, "publishing after the slices were deleted: no complete ResourceSlice pool"},
		{faultNoCDISpec, CheckPrepare, "is in no spec under"},
		{faultWrongDevice, CheckPrepare, "NodePrepareResources reported device"},
		{faultStaleCDI, CheckPrepare, "is still defined under"},
	}
	for _, c := range broken {
		t.Run("broken: "+c.fault, func(t *testing.T) {
			err := c.check(session(t, cluster, goDriverSpec(self, c.fault)))
			if err == nil {
				t.Fatalf("a driver whose %s passed the check", c.fault)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Fatalf("the check failed, but not for the fault (%s):\n%v", c.fault, err)
			}
			t.Logf("caught: %s", strings.SplitN(err.Error(), "\n", 2)[0])
		})
	}
}
