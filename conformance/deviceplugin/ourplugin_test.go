package deviceplugin

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ours prepares our plugin with an image's config file (or a file derived from one) and model.
func ours(t *testing.T, config string, model Model, args ...string) *OurPlugin {
	t.Helper()
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	python, err := PluginPython(repo)
	if err != nil {
		t.Fatal(err)
	}
	if model.RegisterWithin == 0 {
		// a Python start on a busy 2-CPU machine takes up to a few seconds
		model.RegisterWithin = 30 * time.Second
	}
	model.Env = featuresDisabled
	return NewOurPlugin(python, repo, config, t.TempDir(), model, args...)
}

// featuresDisabled is what every Allocate answer of ours carries unless the config enables a feature:
// the toolkit would otherwise hand any GPU container that asks every InfiniBand, NVSwitch, GDS and
// GDRCopy device on the node (plugin/README.md, docs/layer.md "GPU isolation").
var featuresDisabled = map[string]string{"NVIDIA_GDS": "disabled", "NVIDIA_MOFED": "disabled",
	"NVIDIA_GDRCOPY": "disabled", "NVIDIA_NVSWITCH": "disabled"}

func repoRoot(t *testing.T) string {
	t.Helper()
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

func simulatedModel(gpus, replicas int) Model {
	m := Model{Resource: "nvidia.com/gpu", Replicas: replicas, Spreads: true, HandOver: EnvVar,
		RuntimeName: func(gpu string) string { return gpu }}
	for i := range gpus {
		m.GPUs = append(m.GPUs, fmt.Sprintf("sim-gpu-%d", i))
	}
	return m
}

// simulated is our plugin on the QEMU image's config (two simulated GPUs, envvar), health
// flipped through files, recovery at once.
func simulated(t *testing.T) *OurPlugin {
	p := ours(t, ImageConfig(repoRoot(t), "qemuall"), simulatedModel(2, 1), "--health-recovery-period", "0")
	p.HealthDir = t.TempDir()
	return p
}

// timeSliced is the QEMU image's config with 8 simulated GPUs of 4 time-sliced replicas each.
func timeSliced(t *testing.T, gpus, replicas int) *OurPlugin {
	image, err := os.ReadFile(ImageConfig(repoRoot(t), "qemuall"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(image)
	if !strings.Contains(text, "simulatedGpus: 2\n") {
		t.Fatalf("the QEMU image's config no longer says simulatedGpus: 2; adapt this test:\n%s", text)
	}
	text = strings.Replace(text, "simulatedGpus: 2\n", fmt.Sprintf("simulatedGpus: %d\n", gpus), 1)
	text += fmt.Sprintf("sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n", replicas)
	config := filepath.Join(t.TempDir(), "gpu-device-plugin.yaml")
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p := ours(t, config, simulatedModel(gpus, replicas), "--health-recovery-period", "0")
	p.HealthDir = t.TempDir()
	return p
}

// The image's QEMU configuration through every check but the time-slicing one.
func TestOurPluginSimulated(t *testing.T) {
	for _, check := range Checks {
		if check.Name == "preferred allocation" {
			continue
		}
		t.Run(check.Name, func(t *testing.T) {
			if err := check.Run(session(t, simulated(t))); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Time-slicing: replicas advertised, spread by the plugin's preferred allocation, all of a GPU's
// replicas leaving together, a restart keeping the running pod's replica.
func TestOurPluginTimeSliced(t *testing.T) {
	for _, name := range []string{"preferred allocation", "admission", "health", "kubelet restart"} {
		t.Run(name, func(t *testing.T) {
			for _, check := range Checks {
				if check.Name == name {
					if err := check.Run(session(t, timeSliced(t, 8, 4))); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// 4,096 devices (~120 KiB a list): the list and a change of it reach the manager whole, through
// grpc-go's flow-control window growth on the kubelet's side.
func TestOurPluginLargeDeviceList(t *testing.T) {
	s := session(t, timeSliced(t, 64, 64))
	if err := CheckRegistration(s); err != nil {
		t.Fatal(err)
	}
	if err := s.Plugin.SetHealth("sim-gpu-7", false); err != nil {
		t.Fatal(err)
	}
	if err := s.waitCapacity("one GPU of 64 unhealthy", 4096, 4096-64); err != nil {
		t.Fatal(err)
	}
	a, err := s.admit(2)
	if err != nil {
		t.Fatal(err)
	}
	s.Manager.Release(a.Pod)
}

// fixture copies a fixture tree (the plugin's health monitor and CDI writer may write there).
func fixture(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join(repoRoot(t), "tests", "plugin", "fixtures", name)
	dst := filepath.Join(t.TempDir(), name)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		default:
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, data, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func jetson(gpu string, handOver HandOver) Model {
	return Model{Resource: "nvidia.com/gpu", GPUs: []string{gpu}, Replicas: 1, HandOver: handOver,
		RuntimeName: func(string) string { return "0" }} // the CSV-mode runtime knows the iGPU as 0
}

func admitAll(t *testing.T, s *Session) {
	t.Helper()
	for _, check := range []func(*Session) error{CheckAdmission, CheckKubeletRestart} {
		if err := check(s); err != nil {
			t.Fatal(err)
		}
	}
}

// The Orin and Thor images' config (volume mounts) on the Orin Nano R39 fixture.
func TestOurPluginOrinVolumeMounts(t *testing.T) {
	p := ours(t, ImageConfig(repoRoot(t), "tegra"), jetson("tegra-t234-igpu0", VolumeMounts),
		"--host-root", fixture(t, "jetson-orin-nano-r39"))
	admitAll(t, session(t, p))
}

// The Nano image's config (NVIDIA_VISIBLE_DEVICES, all its runtime reads) on the Nano fixture.
func TestOurPluginNanoEnvVar(t *testing.T) {
	p := ours(t, ImageConfig(repoRoot(t), "tegra210"), jetson("tegra-t210-igpu0", EnvVar),
		"--host-root", fixture(t, "jetson-nano"))
	admitAll(t, session(t, p))
}

// derived is an image's config file with its hand-over strategy changed and lines added.
func derived(t *testing.T, machine, strategy, more string) string {
	t.Helper()
	image, err := os.ReadFile(ImageConfig(repoRoot(t), machine))
	if err != nil {
		t.Fatal(err)
	}
	text := string(image)
	for _, from := range []string{"deviceListStrategy: volume-mounts\n", "deviceListStrategy: envvar\n"} {
		text = strings.Replace(text, from, "deviceListStrategy: "+strategy+"\n", 1)
	}
	if !strings.Contains(text, "deviceListStrategy: "+strategy+"\n") {
		t.Fatalf("the %s image's config names no deviceListStrategy to change; adapt this test:\n%s", machine, image)
	}
	config := filepath.Join(t.TempDir(), "gpu-device-plugin.yaml")
	if err := os.WriteFile(config, []byte(text+more), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

// CDI names in the CRI field on the AGX Orin R36 fixture, whose toolkit CSV-mode spec names the
// iGPU "0": the container gets that name and nothing else.
func TestOurPluginOrinCDI(t *testing.T) {
	model := jetson("tegra-t234-igpu0", CDINames)
	model.CDIName = func(string) string { return "nvidia.com/gpu=0" }
	p := ours(t, derived(t, "tegra", "cdi-cri", ""), model, "--host-root", fixture(t, "jetson-agx-orin-r36"),
		"--cdi-spec-dir", t.TempDir())
	admitAll(t, session(t, p))
}

// Device nodes passed as device specs on the AGX Thor fixture (NVIDIA's open driver): the GPU's,
// the control node, the SoC display's, nvmap, host1x-fence, and the UVM and modeset nodes it has.
func TestOurPluginThorDeviceSpecs(t *testing.T) {
	model := jetson("tegra-t264-igpu0", VolumeMounts)
	model.DeviceNodes = func(string) []string {
		return []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1", "/dev/nvmap", "/dev/host1x-fence",
			"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
	}
	p := ours(t, ImageConfig(repoRoot(t), "tegra"), model, "--host-root", withImageRuntimeSettings(t, fixture(t, "jetson-agx-thor-r39")),
		"--pass-device-specs", "true")
	admitAll(t, session(t, p))
}

// withImageRuntimeSettings applies to a host tree's NVIDIA runtime config what the image's
// gpu-k8s-nvidia-runtime-config unit sets at boot (nvidia-ctk --set; the Orin R39 fixture has it
// applied already, the Thor fixture is meta-tegra's output before it): the plugin reads the hand-over
// the runtime honours from there and refuses volume mounts the runtime would ignore.
func withImageRuntimeSettings(t *testing.T, root string) string {
	t.Helper()
	path := filepath.Join(root, "etc", "nvidia-container-runtime", "config.toml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for from, to := range map[string]string{
		"#accept-nvidia-visible-devices-as-volume-mounts = false":        "accept-nvidia-visible-devices-as-volume-mounts = true",
		"#accept-nvidia-visible-devices-envvar-when-unprivileged = true": "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
	} {
		if !strings.Contains(text, from+"\n") {
			t.Fatalf("%s has no line %q to set as the image does; adapt this test", path, from)
		}
		text = strings.Replace(text, from+"\n", to+"\n", 1)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}
