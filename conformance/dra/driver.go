package dra

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

// DriverEnv names what the harness hands a driver (README.md, "The DRA driver contract").
const (
	EnvKubeconfig  = "KUBECONFIG"            // kubeconfig for the API server
	EnvNodeName    = "NODE_NAME"             // the node to publish for
	EnvDriverName  = "DRA_DRIVER_NAME"       // the driver name to register and publish under
	EnvRegistryDir = "KUBELET_REGISTRAR_DIR" // /var/lib/kubelet/plugins_registry on a node
	EnvPluginsDir  = "KUBELET_PLUGINS_DIR"   // /var/lib/kubelet/plugins on a node
	EnvCDIDir      = "CDI_DIR"               // /var/run/cdi on a node
	EnvStateDir    = "DRA_STATE_DIR"         // the driver's own state, kept across its restarts
)

// Layout is one test's directories, standing in for the node's.
type Layout struct {
	Root        string
	RegistryDir string
	PluginsDir  string
	CDIDir      string
	StateDir    string // the driver's
	KubeletDir  string // the DRA manager's checkpoint
}

// NewLayout makes the directories under root (kept short: socket paths hold 107 bytes).
func NewLayout(root string) (Layout, error) {
	l := Layout{Root: root, RegistryDir: filepath.Join(root, "plugins_registry"),
		PluginsDir: filepath.Join(root, "plugins"), CDIDir: filepath.Join(root, "cdi"),
		StateDir: filepath.Join(root, "driver"), KubeletDir: filepath.Join(root, "kubelet")}
	for _, dir := range []string{l.RegistryDir, l.PluginsDir, l.CDIDir, l.StateDir, l.KubeletDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return l, err
		}
	}
	return l, nil
}

// Driver is a DRA driver process: `sh -c COMMAND` with the contract's environment.
type Driver struct {
	Name    string // the driver name handed to it
	Command string
	Env     []string // more environment (the in-test driver's switch)
	layout  Layout
	cluster *Cluster

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

func (d *Driver) logPath() string { return filepath.Join(d.layout.Root, "driver.log") }

// Start starts the driver; it returns once started, not registered.
func (d *Driver) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		return errors.New("driver already running")
	}
	log, err := os.OpenFile(d.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command("/bin/sh", "-c", d.Command)
	cmd.Env = append(os.Environ(), d.Env...)
	cmd.Env = append(cmd.Env,
		EnvKubeconfig+"="+d.cluster.Kubeconfig, EnvNodeName+"="+NodeName, EnvDriverName+"="+d.Name,
		EnvRegistryDir+"="+d.layout.RegistryDir, EnvPluginsDir+"="+d.layout.PluginsDir,
		EnvCDIDir+"="+d.layout.CDIDir, EnvStateDir+"="+d.layout.StateDir)
	cmd.Stdout, cmd.Stderr = log, log
	// its own process group: SIGTERM reaches the driver, not only the shell
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	fmt.Fprintf(log, "=== sh -c %q\n", d.Command)
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd, d.done = cmd, make(chan error, 1)
	go func(done chan error) { done <- cmd.Wait() }(d.done)
	return nil
}

// Stop sends SIGTERM to the driver's process group and waits (10 s, then SIGKILL).
func (d *Driver) Stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return nil
	}
	defer func() { d.cmd = nil }()
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-d.done:
		var exit *exec.ExitError
		if errors.As(err, &exit) && !exit.Exited() {
			return nil // ended by the signal itself: a driver without a handler
		}
		if err != nil {
			return fmt.Errorf("driver exited %v on SIGTERM", err)
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
		return errors.New("driver did not stop within 10 s of SIGTERM")
	}
}

// Diagnostics is the driver's last output.
func (d *Driver) Diagnostics() string {
	data, err := os.ReadFile(d.logPath())
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-25):], "\n")
}
