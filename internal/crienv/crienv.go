// Package crienv runs a private containerd (Debian's containerd 1.6 with
// runc) inside a network namespace the caller made, so a test or benchmark
// can start pods through CRI exactly as the kubelet does and watch what the
// CNI plugins do to that "node". Everything containerd keeps (root, state,
// sockets, CNI bin and conf dirs, logs) lives under one directory; the only
// machine-wide things it touches are what containerd's CRI always uses: pod
// network namespaces under /var/run/netns, the libcni cache under
// /var/lib/cni, the runc cgroups of the pods it runs and the shims' sockets
// (hashed names) in /run/containerd/s.
//
// crictl (not packaged by Debian 12) is built from the Go module proxy by
// scripts/crictl.sh and cached under /var/cache/village. Used by the
// containerd end-to-end test (test/runtime) and by the runtime row of
// bench/cmd/cnibench.
package crienv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Options describe one containerd.
type Options struct {
	// Dir holds everything of this containerd; the caller makes and removes it.
	Dir string
	// NetNS is the path of the network namespace containerd (and so every CNI
	// plugin it execs) runs in: the test's node.
	NetNS string
	// CNIBins maps a plugin name to the binary linked as that name into the
	// CNI binary directory.
	CNIBins map[string]string
	// Confs maps file names to contents written into the CNI conf dir before
	// containerd starts (containerd 1.6 watches the dir but misses files
	// renamed into it; write later ones in place).
	Confs map[string][]byte
	// SandboxImage is the pause image's reference (import it with Import
	// before the first pod).
	SandboxImage string
	// Crictl is the crictl binary (see BuildCrictl).
	CrictlBin string
}

// Env is a running containerd.
type Env struct {
	Options
	Socket, BinDir, ConfDir, LogDir, LogPath string

	cmd  *exec.Cmd
	done chan error
}

// Start writes config.toml and the CNI files, starts containerd in the node
// namespace and waits (up to a minute) until its CRI answers.
func Start(o Options) (*Env, error) {
	e := &Env{
		Options: o,
		Socket:  filepath.Join(o.Dir, "containerd.sock"),
		BinDir:  filepath.Join(o.Dir, "cni", "bin"),
		ConfDir: filepath.Join(o.Dir, "cni", "net.d"),
		LogDir:  filepath.Join(o.Dir, "pods"),
		LogPath: filepath.Join(o.Dir, "containerd.log"),
	}
	for _, d := range []string{e.BinDir, e.ConfDir, e.LogDir, filepath.Join(o.Dir, "opt")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for name, src := range o.CNIBins {
		if err := os.Symlink(src, filepath.Join(e.BinDir, name)); err != nil {
			return nil, fmt.Errorf("link CNI plugin %q: %w", name, err)
		}
	}
	for name, body := range o.Confs {
		if err := os.WriteFile(filepath.Join(e.ConfDir, name), body, 0o644); err != nil {
			return nil, fmt.Errorf("write CNI conf %q: %w", name, err)
		}
	}
	crictlCfg := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n", e.Socket, e.Socket)
	if err := os.WriteFile(filepath.Join(o.Dir, "crictl.yaml"), []byte(crictlCfg), 0o644); err != nil {
		return nil, err
	}
	cfg := filepath.Join(o.Dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(e.config()), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(e.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("containerd not found (scripts/deps.sh installs it): %w", err)
	}
	e.cmd = exec.Command(bin, "--config", cfg)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	// Its own process group: a signal to the caller's group does not reach it
	// before Stop has removed the pods.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := inNS(o.NetNS, e.cmd.Start); err != nil {
		return nil, fmt.Errorf("start containerd in %s: %w", o.NetNS, err)
	}
	e.done = make(chan error, 1)
	go func() { e.done <- e.cmd.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := e.Crictl("info")
		if err == nil {
			return e, nil
		}
		select {
		case werr := <-e.done:
			e.done <- werr
			return e, fmt.Errorf("containerd exited at start (%v); log:\n%s", werr, e.Log())
		default:
		}
		if time.Now().After(deadline) {
			return e, fmt.Errorf("containerd's CRI did not answer within a minute: %v; log:\n%s", err, e.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// config is this Env's config.toml: everything under Dir.
func (e *Env) config() string {
	d := e.Dir
	return Config{Root: filepath.Join(d, "root"), State: filepath.Join(d, "state"), Socket: e.Socket,
		Opt: filepath.Join(d, "opt"), Runc: filepath.Join(d, "runc"), SandboxImage: e.SandboxImage,
		BinDir: e.BinDir, ConfDir: e.ConfDir}.TOML()
}

// Config holds the paths of one containerd's config.toml; the cluster of
// internal/kubecluster writes the same file with a node's private paths.
type Config struct {
	Root, State, Socket, Opt, Runc string // containerd's root, state, socket, opt dir; runc's state root
	BinDir, ConfDir                string // CNI plugin and conf directories
	SandboxImage                   string // the pause image's reference
}

// TOML is containerd 1.6's config.toml (version 2). Notes:
//   - restrict_oom_score_adj: root here may lack CAP_SYS_RESOURCE, and runc
//     fails to lower a container's oom_score_adj without it.
//   - the native snapshotter: plain directories, works on any file system
//     (overlayfs on overlayfs does not).
//   - the stream server (crictl exec) listens on the node's loopback.
//   - runc keeps its state apart from any system containerd.
func (c Config) TOML() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, c.Root, c.State, c.Socket, c.Socket+".ttrpc", c.Opt, c.SandboxImage, c.Runc, c.BinDir, c.ConfDir)
}

// inNS runs f on a thread switched into the namespace at path; processes
// started by f inherit it.
func inNS(path string, f func() error) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// run runs a command in the node namespace with a bound and returns its
// standard output (with combined, standard error too, in order).
func (e *Env) run(timeout time.Duration, combined bool, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if combined {
		cmd.Stderr = &out
	}
	err := inNS(e.NetNS, cmd.Run)
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s%s", filepath.Base(name), strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String(), nil
}

// Crictl runs crictl against this containerd (in the node namespace, where
// the stream server for exec listens) and returns its standard output.
func (e *Env) Crictl(args ...string) (string, error) {
	return e.run(2*time.Minute, false, e.CrictlBin, e.crictlArgs(args)...)
}

// ContainerLogs returns what a container wrote, standard output and error
// interleaved (crictl logs copies the container's stderr to its own).
func (e *Env) ContainerLogs(id string) (string, error) {
	return e.run(2*time.Minute, true, e.CrictlBin, e.crictlArgs([]string{"logs", id})...)
}

func (e *Env) crictlArgs(args []string) []string {
	return append([]string{"--config", filepath.Join(e.Dir, "crictl.yaml")}, args...)
}

// Ctr runs ctr in the k8s.io namespace (the one CRI uses).
func (e *Env) Ctr(args ...string) (string, error) {
	return e.run(2*time.Minute, false, "ctr", append([]string{"--address", e.Socket, "--namespace", "k8s.io"}, args...)...)
}

// Import imports an OCI archive for CRI, unpacked for its snapshotter.
func (e *Env) Import(archive string) error {
	_, err := e.Ctr("images", "import", "--snapshotter", "native", archive)
	return err
}

// Log returns containerd's log (the last 200 lines).
func (e *Env) Log() string {
	b, _ := os.ReadFile(e.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 200 {
		lines = lines[len(lines)-200:]
	}
	return strings.Join(lines, "\n")
}

// Stop removes every pod left (stop, remove: the CNI DELs), stops containerd,
// kills shims it left, and unmounts whatever is still mounted under Dir. It
// returns the first error but always does every step.
func (e *Env) Stop() error {
	var errs []error
	if e.cmd == nil || e.cmd.Process == nil {
		return nil
	}
	if out, err := e.Crictl("pods", "-q"); err == nil && strings.TrimSpace(out) != "" {
		if _, err := e.Crictl("rmp", "-f", "-a"); err != nil {
			errs = append(errs, err)
		}
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
	e.cmd = nil
	killShims(e.Socket)
	if err := unmountUnder(e.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killShims kills the containerd-shim-runc-v2 processes started for this
// containerd (found by the -address argument naming its socket) with their
// containers; normally none is left after the pods were removed.
func killShims(socket string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		for i := range args[:len(args)-1] {
			if args[i] == "-address" && args[i+1] == socket {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				if pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	}
}

// unmountUnder unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// BuildCrictl returns the crictl binary scripts/crictl.sh built (or builds it
// now, a few minutes once per machine). root is the module root.
func BuildCrictl(root string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "scripts", "crictl.sh"))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/crictl.sh: %w: %s", err, stderr.String())
	}
	return strings.TrimSpace(out.String()), nil
}
