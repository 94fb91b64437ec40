// Package deviceplugin checks a device plugin against the kubelet's own device manager: what the
// manager ends up with (capacity, allocatable, each container's devices, environment, mounts,
// device nodes and CDI names) after registration, admissions, health changes and restarts on
// either side. Every check returns an error naming what went wrong; the tests run them against
// our plugin as the image runs it and against deliberately broken plugins, which must fail them.
package deviceplugin

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

// Subject is a plugin under test: a process or server that registers with the kubelet socket in
// a directory.
type Subject interface {
	// Start starts the plugin for the kubelet socket in dir; it returns once started, not
	// registered (registration is what the checks observe).
	Start(dir string) error
	// Stop stops it as systemd does (SIGTERM), waiting for it to end.
	Stop() error
	// SetHealth marks a physical GPU unhealthy or healthy again by the plugin's own means.
	SetHealth(gpu string, healthy bool) error
	// Diagnostics is the plugin's recent output, for failure messages.
	Diagnostics() string
	// Model is what the plugin advertises and how it must answer Allocate.
	Model() Model
}

// HandOver is how Allocate hands GPUs to the container runtime.
type HandOver string

const (
	EnvVar       HandOver = "envvar"        // NVIDIA_VISIBLE_DEVICES=<names>
	VolumeMounts HandOver = "volume-mounts" // /dev/null on /var/run/nvidia-container-devices/<name>
	CDINames     HandOver = "cdi-cri"       // CDI device names in the CRI field
)

// Model describes a plugin's devices and its answers, so the checks know what to expect.
type Model struct {
	Resource string
	GPUs     []string // physical GPU IDs, in index order
	Replicas int      // time-slicing replicas per GPU (1: none)
	// Spreads: GetPreferredAllocation spreads replicas over GPUs (the "distributed" policy).
	Spreads  bool
	HandOver HandOver
	// RuntimeName is the name the runtime gets for a GPU (its ID, an index).
	RuntimeName func(gpu string) string
	// CDIName is the qualified CDI name of a GPU (HandOver CDINames only).
	CDIName func(gpu string) string
	// DeviceNodes are the host device nodes a GPU's container must get (nil: none passed).
	DeviceNodes func(gpu string) []string
	// RegisterWithin bounds how long registration and re-registration may take.
	RegisterWithin time.Duration
	// Env is set in every answer besides the hand-over, whatever it is (our plugin: the NVIDIA
	// toolkit's feature variables, disabled, so a pod's own env cannot turn their devices on).
	Env map[string]string
}

// Devices is the number of devices the plugin advertises.
func (m Model) Devices() int { return len(m.GPUs) * max(1, m.Replicas) }

// GPUOf maps a device ID to its physical GPU: a replica "<gpu>::<n>" to <gpu>.
func (m Model) GPUOf(device string) string {
	gpu, _, _ := strings.Cut(device, "::")
	return gpu
}

// VolumeMountDir is where the NVIDIA runtime looks for volume-mount device requests.
const VolumeMountDir = "/var/run/nvidia-container-devices"

// checkHandOver compares a container's run options with what the plugin must answer for the
// devices the manager allocated to it.
func (m Model) checkHandOver(devices []string, options *devicemanager.DeviceRunContainerOptions) error {
	if options == nil {
		return fmt.Errorf("the manager has no run options for a container holding %v", devices)
	}
	var gpus []string
	for _, device := range devices {
		if gpu := m.GPUOf(device); !slices.Contains(gpus, gpu) {
			gpus = append(gpus, gpu)
		}
	}
	sort.Slice(gpus, func(i, j int) bool { return slices.Index(m.GPUs, gpus[i]) < slices.Index(m.GPUs, gpus[j]) })
	names := make([]string, len(gpus))
	for i, gpu := range gpus {
		names[i] = m.RuntimeName(gpu)
	}
	env := map[string]string{}
	for _, e := range options.Envs {
		env[e.Name] = e.Value
	}
	for name, want := range m.Env {
		if got, ok := env[name]; !ok || got != want {
			return fmt.Errorf("container holding %v got %s=%q, want %q in every answer", devices, name, got, want)
		}
	}
	switch m.HandOver {
	case EnvVar:
		if got, want := env["NVIDIA_VISIBLE_DEVICES"], strings.Join(names, ","); got != want {
			return fmt.Errorf("container holding %v got NVIDIA_VISIBLE_DEVICES=%q, want %q", devices, got, want)
		}
	case VolumeMounts:
		if got := env["NVIDIA_VISIBLE_DEVICES"]; got != VolumeMountDir {
			return fmt.Errorf("container holding %v got NVIDIA_VISIBLE_DEVICES=%q, want %q", devices, got, VolumeMountDir)
		}
		var want []kubecontainer.Mount
		for _, name := range names {
			want = append(want, kubecontainer.Mount{ContainerPath: VolumeMountDir + "/" + name, HostPath: "/dev/null", ReadOnly: true})
		}
		if got := mountsOf(options); !slices.Equal(got, want) {
			return fmt.Errorf("container holding %v got mounts %v, want %v", devices, got, want)
		}
	case CDINames:
		var want []string
		for _, gpu := range gpus {
			want = append(want, m.CDIName(gpu))
		}
		var got []string
		for _, d := range options.CDIDevices {
			got = append(got, d.Name)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("container holding %v got CDI devices %v, want %v", devices, got, want)
		}
		extra := slices.DeleteFunc(slices.Clone(options.Envs), func(e kubecontainer.EnvVar) bool {
			_, always := m.Env[e.Name]
			return always
		})
		if len(extra) != 0 || len(options.Mounts) != 0 {
			return fmt.Errorf("container holding %v got env %v and mounts %v besides its CDI devices", devices,
				options.Envs, options.Mounts)
		}
	default:
		return fmt.Errorf("model: unknown hand-over %q", m.HandOver)
	}
	var wantNodes []string
	if m.DeviceNodes != nil {
		for _, gpu := range gpus {
			for _, node := range m.DeviceNodes(gpu) {
				if !slices.Contains(wantNodes, node) {
					wantNodes = append(wantNodes, node)
				}
			}
		}
	}
	var gotNodes []string
	for _, d := range options.Devices {
		if d.PathOnHost != d.PathInContainer || d.Permissions != "rw" {
			return fmt.Errorf("container holding %v got device %+v: want the host path in the container, rw", devices, d)
		}
		gotNodes = append(gotNodes, d.PathOnHost)
	}
	slices.Sort(gotNodes) // the runtime creates them all; their order means nothing
	slices.Sort(wantNodes)
	if !slices.Equal(gotNodes, wantNodes) {
		return fmt.Errorf("container holding %v got device nodes %v, want %v", devices, gotNodes, wantNodes)
	}
	return nil
}

// mountsOf keeps the fields a plugin's mount sets (the manager fills no others).
func mountsOf(options *devicemanager.DeviceRunContainerOptions) []kubecontainer.Mount {
	var out []kubecontainer.Mount
	for _, m := range options.Mounts {
		out = append(out, kubecontainer.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	return out
}
