package deviceplugin

import (
	"os"
	"strings"
	"testing"
)

// shortDir is a fresh directory with a short path (a Unix socket path holds 107 bytes).
func shortDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func session(t *testing.T, plugin Subject) *Session {
	t.Helper()
	s, err := NewSession(shortDir(t, "dp-"), plugin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Every check passes for a plugin that does what ours does: so a check that fails below fails
// because of the fault, not because of the harness.
func TestEveryCheckPassesForACorrectPlugin(t *testing.T) {
	for _, check := range Checks {
		t.Run(check.Name, func(t *testing.T) {
			if err := check.Run(session(t, newGoPlugin(NoFault, 8, 4))); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The checks catch each deliberately broken plugin, with a message that names the fault.
func TestChecksCatchBrokenPlugins(t *testing.T) {
	cases := []struct {
		fault Fault
		check func(*Session) error
		says  string
	}{
		{WrongDevice, CheckAdmission, "got NVIDIA_VISIBLE_DEVICES="},
		{NoReRegistration, CheckKubeletRestart, "registration after a kubelet restart: the device manager reports"},
		{SilentList, CheckRegistration, "registration: the device manager reports nvidia.com/gpu capacity 0, allocatable 0"},
		{DeafHealth, CheckHealth, "GPU go-gpu-7 unhealthy: the device manager reports nvidia.com/gpu capacity 32, allocatable 32"},
	}
	for _, c := range cases {
		t.Run(string(c.fault), func(t *testing.T) {
			err := c.check(session(t, newGoPlugin(c.fault, 8, 4)))
			if err == nil {
				t.Fatalf("a plugin that %s passed the check", c.fault)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Fatalf("the check failed, but not for the fault (%s):\n%v", c.fault, err)
			}
			t.Logf("caught: %v", strings.SplitN(err.Error(), "\n", 2)[0])
		})
	}
}
