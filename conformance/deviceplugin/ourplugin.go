package deviceplugin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RepoRoot finds the repository holding this module: CONFORMANCE_REPO, else the nearest parent
// of the working directory with plugin/src/gpu_device_plugin.
func RepoRoot() (string, error) {
	if root := os.Getenv("CONFORMANCE_REPO"); root != "" {
		return root, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "plugin", "src", "gpu_device_plugin")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no plugin/src/gpu_device_plugin above the working directory; set CONFORMANCE_REPO")
		}
		dir = parent
	}
}

// PluginPython is the interpreter our plugin runs on: GPU_PLUGIN_PYTHON, else the image's stack
// that ./task test makes (.venvs/plugin-oldest).
func PluginPython(repo string) (string, error) {
	if python := os.Getenv("GPU_PLUGIN_PYTHON"); python != "" {
		return python, nil
	}
	python := filepath.Join(repo, ".venvs", "plugin-oldest", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		return "", fmt.Errorf("%s is missing: run ./task test once (it makes the plugin's venvs) "+
			"or point GPU_PLUGIN_PYTHON at a Python with the plugin's requirements", python)
	}
	return python, nil
}

// ImageConfig is a config file an image installs (meta-gpu-k8s/.../gpu-device-plugin/files/).
func ImageConfig(repo, machine string) string {
	return filepath.Join(repo, "meta-gpu-k8s", "recipes-plugin", "gpu-device-plugin", "files", machine,
		"gpu-device-plugin.yaml")
}

// OurPlugin is gpu_device_plugin started as the image's unit starts it (`gpu-device-plugin
// --config-file <the image's file>`, a CacheDirectory), plus the flags a test needs: the kubelet
// socket in the session's directory, a fixture tree as host root, a health directory.
type OurPlugin struct {
	Python     string
	Repo       string
	ConfigFile string
	Args       []string // more flags
	HealthDir  string   // --simulated-health-dir (simulated backend), for SetHealth
	Work       string   // its cache directory and log live here
	model      Model

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

// NewOurPlugin prepares the plugin with model as what it must advertise and answer.
func NewOurPlugin(python, repo, configFile, work string, model Model, args ...string) *OurPlugin {
	return &OurPlugin{Python: python, Repo: repo, ConfigFile: configFile, Args: args, Work: work, model: model}
}

func (p *OurPlugin) Model() Model { return p.model }

func (p *OurPlugin) logPath() string { return filepath.Join(p.Work, "plugin.log") }

func (p *OurPlugin) Start(dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("already running")
	}
	cache := filepath.Join(p.Work, "cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(p.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	argv := []string{"-m", "gpu_device_plugin", "--config-file", p.ConfigFile,
		"--kubelet-socket", filepath.Join(dir, "kubelet.sock")}
	argv = append(argv, p.Args...)
	if p.HealthDir != "" {
		argv = append(argv, "--simulated-health-dir", p.HealthDir)
	}
	cmd := exec.Command(p.Python, argv...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(p.Repo, "plugin", "src"), "CACHE_DIRECTORY="+cache,
		"JOURNAL_STREAM=")
	cmd.Stdout, cmd.Stderr = log, log
	fmt.Fprintf(log, "=== %s %s\n", p.Python, strings.Join(argv, " "))
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.done = cmd, make(chan error, 1)
	go func(done chan error) { done <- cmd.Wait() }(p.done)
	return nil
}

// Stop sends SIGTERM, as systemd stops the unit, and waits for the exit (10 s, the unit's
// TimeoutStopSec, before SIGKILL).
func (p *OurPlugin) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	defer func() { p.cmd = nil }()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("plugin exited %v on SIGTERM", exit)
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("plugin did not stop within 10 s of SIGTERM")
	}
}

func (p *OurPlugin) SetHealth(gpu string, healthy bool) error {
	if p.HealthDir == "" {
		return errors.New("this plugin has no simulated health directory")
	}
	path := filepath.Join(p.HealthDir, gpu)
	if healthy {
		return os.WriteFile(path, []byte("Healthy\n"), 0o644)
	}
	return os.WriteFile(path, []byte("Unhealthy\n"), 0o644)
}

// Diagnostics: the last lines the plugin logged.
func (p *OurPlugin) Diagnostics() string {
	data, err := os.ReadFile(p.logPath())
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-25):], "\n")
}
