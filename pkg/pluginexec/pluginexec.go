// Package pluginexec runs a CNI plugin binary the way a runtime does: found
// by name in CNI_PATH, the network configuration on stdin, the CNI_*
// variables in its environment, its result (or its CNI error) read from
// stdout.
//
// It does what containernetworking/cni/pkg/invoke does for village (its
// IPAM call) and village-ipam (its store helper), without importing it:
// since cni v1.3 that package links OpenTelemetry, which brings net/http
// and crypto/tls into every binary that imports it, and their package
// initialisation runs on every exec of the plugin — the main cost a plugin
// process pays before its own work. The result types, their versions and
// the error type still come from containernetworking/cni.
package pluginexec

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
)

// Call is one exec of a plugin.
type Call struct {
	Path    string   // the binary (see Find)
	Command string   // CNI_COMMAND
	Env     []string // CNI_* variables that differ from this process's, "KEY=value"
	Stdin   []byte   // the network configuration
}

// Find returns the first regular file named plugin in the directories of
// cniPath (a CNI_PATH list).
func Find(plugin, cniPath string) (string, error) {
	if plugin == "" || strings.ContainsRune(plugin, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", plugin)
	}
	dirs := filepath.SplitList(cniPath)
	for _, dir := range dirs {
		p := filepath.Join(dir, plugin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in path %v", plugin, dirs)
}

// Env is this process's environment with CNI_COMMAND set to command and
// the variables of overrides ("KEY=value") replacing their namesakes.
func Env(command string, overrides ...string) []string {
	set := map[string]string{"CNI_COMMAND": "CNI_COMMAND=" + command}
	order := []string{"CNI_COMMAND"}
	for _, kv := range overrides {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			order = append(order, k)
		}
		set[k] = kv
	}
	env := make([]string, 0, len(os.Environ())+len(order))
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	for _, k := range order {
		env = append(env, set[k])
	}
	return env
}

// Run execs the plugin and returns what it printed on stdout. A plugin that
// fails yields the *types.Error it printed (or one describing its failure
// when it printed none); what it wrote to stderr goes to this process's
// stderr. The plugin is killed when ctx ends.
func (c Call) Run(ctx context.Context) ([]byte, error) {
	p, err := c.Start()
	if err != nil {
		return nil, err
	}
	return p.wait(ctx)
}

// Result runs the plugin and decodes its result in the version it printed
// (the configuration's cniVersion when the result names none, as libcni
// does for old plugins).
func (c Call) Result(ctx context.Context) (types.Result, error) {
	p, err := c.Start()
	if err != nil {
		return nil, err
	}
	return p.Result(ctx)
}

// Proc is a plugin process started by Start. Until Send it has no input:
// it can start up, and then it waits on its stdin.
type Proc struct {
	call  Call
	pid   int
	stdin *os.File // nil once sent
	out   *os.File // stdout, read end
	errs  *os.File // stderr, read end
	done  bool     // reaped

	// Between Output and Wait:
	reading bool
	ctx     context.Context
	stdout  []byte
	rerr    error
	stderr  chan []byte
	stop    chan struct{} // closed to stop the context watcher
	stopped chan struct{} // closed by the watcher when it returns
	waited  bool
	werr    error
}

// Start forks the plugin without giving it its configuration: a caller can
// let it start up (for a Go plugin, the runtime's start and package
// initialisation, a few milliseconds) while it still checks its own input,
// then Send, or Abort when the input is bad. A plugin Aborted before Send has
// read nothing, so it cannot have claimed or changed anything.
//
// It forks with syscall.ForkExec rather than os/exec: os.StartProcess tests
// once per process whether pidfds work by forking a throwaway child, which
// for a plugin that execs one child is a second fork (and, on a busy node, a
// second wait for the scheduler) on every ADD and DEL.
func (c Call) Start() (*Proc, error) {
	var pipes [3][2]*os.File // stdin, stdout, stderr: [read, write]
	closeAll := func() {
		for _, p := range pipes {
			for _, f := range p {
				if f != nil {
					f.Close()
				}
			}
		}
	}
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("failed to run plugin %s: %w", c.Path, err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	growPipe(pipes[0][1], len(c.Stdin))
	attr := &syscall.ProcAttr{
		Env:   Env(c.Command, c.Env...),
		Files: []uintptr{pipes[0][0].Fd(), pipes[1][1].Fd(), pipes[2][1].Fd()},
	}
	pid, err := forkExec(c.Path, attr)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("failed to run plugin %s: %w", c.Path, err)
	}
	// The child's ends belong to the child now.
	pipes[0][0].Close()
	pipes[1][1].Close()
	pipes[2][1].Close()
	return &Proc{call: c, pid: pid, stdin: pipes[0][1], out: pipes[1][0], errs: pipes[2][0]}, nil
}

// growPipe makes the pipe hold n bytes when its default capacity (64 KiB)
// is smaller, so that Send does not wait for the plugin to start reading.
// Best effort: Send is still correct (only later) when the kernel refuses.
func growPipe(f *os.File, n int) {
	if n <= 64<<10 {
		return
	}
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, n)
		})
	}
}

// Send gives the plugin its configuration and closes its stdin. A plugin
// that exits without reading it is fine: its exit status says how it went.
func (p *Proc) Send() {
	if p.stdin == nil {
		return
	}
	_, _ = p.stdin.Write(p.call.Stdin)
	p.stdin.Close()
	p.stdin = nil
}

// Abort kills the plugin and reaps it. Before Send it has read nothing;
// after Wait it does nothing.
func (p *Proc) Abort() {
	if p == nil || p.done {
		return
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.out.Close()
	p.errs.Close()
	p.reap()
}

// reap waits for the plugin to exit, stops the context watcher, then
// collects the exit status. The watcher may kill the pid only while it is
// still the plugin's: until the process is reaped its pid stays a zombie
// that no other process can be given, so the watcher is stopped after the
// exit (waitid with WNOWAIT) and before the reaping.
func (p *Proc) reap() (syscall.WaitStatus, error) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	if p.stop != nil {
		close(p.stop)
		<-p.stopped
		p.stop = nil
	}
	var ws syscall.WaitStatus
	var err error
	for {
		_, err = syscall.Wait4(p.pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	p.done = true
	return ws, err
}

// Result waits for the plugin (sending its configuration first if Send was
// not called) and decodes its result as Call.Result does.
func (p *Proc) Result(ctx context.Context) (types.Result, error) {
	res, err := p.Output(ctx)
	if werr := p.Wait(); werr != nil {
		return nil, werr
	}
	return res, err
}

// wait sends the plugin its configuration, runs it to its end and returns
// its stdout (Wait fails when stdout could not be read).
func (p *Proc) wait(ctx context.Context) ([]byte, error) {
	if err := p.read(ctx); err != nil {
		return nil, err
	}
	if err := p.Wait(); err != nil {
		return nil, err
	}
	return p.stdout, nil
}

// Output sends the plugin its configuration (if Send was not called),
// reads its stdout to the end and decodes the result there, without
// waiting for the process to exit: a plugin that closes its stdout when it
// is done (as village-ipam does) is still tearing itself down meanwhile,
// and the caller can go on with the result. The result is the plugin's
// answer only if Wait then returns nil; until then the caller must not
// report it. The plugin is killed when ctx ends before Wait.
func (p *Proc) Output(ctx context.Context) (types.Result, error) {
	if err := p.read(ctx); err != nil {
		return nil, err
	}
	if p.rerr != nil {
		return nil, p.rerr
	}
	return p.call.decode(p.stdout)
}

func (p *Proc) read(ctx context.Context) error {
	if p.done || p.reading {
		return fmt.Errorf("plugin %s already waited for", p.call.Path)
	}
	p.reading, p.ctx = true, ctx
	p.Send()
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	go func(pid int, stop <-chan struct{}, stopped chan<- struct{}) {
		defer close(stopped)
		select {
		case <-ctx.Done():
			_ = syscall.Kill(pid, syscall.SIGKILL)
		case <-stop:
		}
	}(p.pid, p.stop, p.stopped)
	p.stderr = make(chan []byte, 1)
	go func(f *os.File, c chan<- []byte) {
		b, _ := io.ReadAll(f)
		c <- b
	}(p.errs, p.stderr)
	p.stdout, p.rerr = io.ReadAll(p.out)
	if p.rerr != nil {
		p.rerr = fmt.Errorf("failed to read the output of plugin %s: %w", p.call.Path, p.rerr)
	}
	return nil
}

// Wait reaps the plugin after Output and returns its failure: a
// *types.Error with what it printed when it exited non-zero, an error when
// it was killed (ctx of Output ended) or its output could not be read.
// What it wrote to stderr goes to this process's stderr. Calling it again
// returns the same.
func (p *Proc) Wait() error {
	if !p.waited {
		p.waited = true
		p.werr = p.finish()
	}
	return p.werr
}

func (p *Proc) finish() error {
	if !p.reading || p.done {
		return fmt.Errorf("plugin %s: Wait without Output", p.call.Path)
	}
	defer p.out.Close()
	defer p.errs.Close()
	stderr := <-p.stderr
	ws, err := p.reap()
	if len(stderr) > 0 {
		_, _ = os.Stderr.Write(stderr)
	}
	c := p.call
	switch {
	case err != nil:
		return fmt.Errorf("failed to wait for plugin %s: %w", c.Path, err)
	case p.ctx.Err() != nil && ws.Signaled():
		return fmt.Errorf("plugin %s killed: %w", c.Path, p.ctx.Err())
	case !ws.Exited() || ws.ExitStatus() != 0:
		return pluginError(waitString(ws), p.stdout, stderr)
	}
	return p.rerr
}

// forkExec starts path, retrying while the binary is being written (as
// libcni does).
func forkExec(path string, attr *syscall.ProcAttr) (int, error) {
	for i := 0; ; i++ {
		pid, err := syscall.ForkExec(path, []string{path}, attr)
		if err != syscall.ETXTBSY || i == 5 {
			return pid, err
		}
		time.Sleep(time.Second)
	}
}

func waitString(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "signal: " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ws.ExitStatus())
}

// decode reads a plugin's result in the version it printed (the
// configuration's cniVersion when the result names none, as libcni does for
// old plugins).
func (c Call) decode(out []byte) (types.Result, error) {
	var peek struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(out, &peek); err != nil {
		return nil, fmt.Errorf("failed to decode the result of %s: %w", c.Path, err)
	}
	if peek.CNIVersion != "" {
		return create.Create(peek.CNIVersion, out)
	}
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("failed to decode the result of %s: %w", c.Path, err)
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(c.Stdin, &conf); err != nil {
		return nil, fmt.Errorf("failed to read cniVersion of the configuration: %w", err)
	}
	if raw == nil {
		raw = map[string]any{}
	}
	raw["cniVersion"] = conf.CNIVersion
	out, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	return create.Create(conf.CNIVersion, out)
}

func pluginError(status string, stdout, stderr []byte) error {
	e := &types.Error{}
	if len(stdout) > 0 {
		if perr := json.Unmarshal(stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, perr)
		}
		if e.Code != 0 || e.Msg != "" {
			return e
		}
		// What it printed was no error (a result, then it failed).
	}
	switch {
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %s", stderr, status)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %s", status)
	}
	return e
}
