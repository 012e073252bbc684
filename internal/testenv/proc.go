package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Proc is a server process a test started (etcd, an API server, a kubelet).
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	done chan struct{}
}

// Spawn starts argv with its output appended to logPath, in its own
// process group (a signal to the test's group does not reach it before the
// test's cleanup stops it). With watchdog, a shell beside it kills it when
// the test process dies without its cleanups (go test's -timeout panics
// past them); bash execs argv, so the process keeps the PID it starts with.
// No Pdeathsig: it fires when the forking OS thread exits, and Go ends
// threads that a namespace switch left locked.
func Spawn(name, logPath string, watchdog bool, argv ...string) (*Proc, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	if watchdog {
		wd := fmt.Sprintf(`(while kill -0 %d 2>/dev/null; do sleep 2; done; kill -9 $$) & exec "$@"`, os.Getpid())
		argv = append([]string{"bash", "-c", wd, "bash"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid is the process's ID.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process group: SIGTERM, SIGKILL after 15 s. A nil Proc
// is stopped already.
func (p *Proc) Stop() {
	if p == nil || p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.done
	}
}
