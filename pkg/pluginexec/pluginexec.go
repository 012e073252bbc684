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
//
// It forks with syscall.ForkExec rather than os/exec: os.StartProcess tests
// once per process whether pidfds work by forking a throwaway child, which
// for a plugin that execs one child is a second fork (and, on a busy node, a
// second wait for the scheduler) on every ADD and DEL.
func (c Call) Run(ctx context.Context) ([]byte, error) {
	var pipes [3][2]*os.File // stdin, stdout, stderr: [read, write]
	defer func() {
		for _, p := range pipes {
			for _, f := range p {
				if f != nil {
					f.Close()
				}
			}
		}
	}()
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("failed to run plugin %s: %w", c.Path, err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	attr := &syscall.ProcAttr{
		Env:   Env(c.Command, c.Env...),
		Files: []uintptr{pipes[0][0].Fd(), pipes[1][1].Fd(), pipes[2][1].Fd()},
	}
	pid, err := forkExec(c.Path, attr)
	if err != nil {
		return nil, fmt.Errorf("failed to run plugin %s: %w", c.Path, err)
	}
	// The child's ends belong to the child now.
	for _, f := range []**os.File{&pipes[0][0], &pipes[1][1], &pipes[2][1]} {
		(*f).Close()
		*f = nil
	}
	exited := make(chan struct{})
	defer close(exited)
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(pid, syscall.SIGKILL)
		case <-exited:
		}
	}()
	stdin := pipes[0][1]
	pipes[0][1] = nil
	go func() {
		_, _ = stdin.Write(c.Stdin) // a plugin that exits without reading it is fine
		stdin.Close()
	}()
	errc := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(pipes[2][0])
		errc <- b
	}()
	stdout, rerr := io.ReadAll(pipes[1][0])
	stderr := <-errc
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	if len(stderr) > 0 {
		_, _ = os.Stderr.Write(stderr)
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("failed to wait for plugin %s: %w", c.Path, err)
	case ctx.Err() != nil && ws.Signaled():
		return nil, fmt.Errorf("plugin %s killed: %w", c.Path, ctx.Err())
	case !ws.Exited() || ws.ExitStatus() != 0:
		return nil, pluginError(waitString(ws), stdout, stderr)
	case rerr != nil:
		return nil, fmt.Errorf("failed to read the output of plugin %s: %w", c.Path, rerr)
	}
	return stdout, nil
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

// Result runs the plugin and decodes its result in the version it printed
// (the configuration's cniVersion when the result names none, as libcni
// does for old plugins).
func (c Call) Result(ctx context.Context) (types.Result, error) {
	out, err := c.Run(ctx)
	if err != nil {
		return nil, err
	}
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
	if out, err = json.Marshal(raw); err != nil {
		return nil, err
	}
	return create.Create(conf.CNIVersion, out)
}

func pluginError(status string, stdout, stderr []byte) error {
	e := &types.Error{}
	switch {
	case len(stdout) > 0:
		if perr := json.Unmarshal(stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, perr)
		}
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %s", stderr, status)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %s", status)
	}
	return e
}
