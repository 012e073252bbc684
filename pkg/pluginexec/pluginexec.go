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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

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
// stderr.
func (c Call) Run(ctx context.Context) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Path)
	cmd.Env = Env(c.Command, c.Env...)
	cmd.Stdin = bytes.NewReader(c.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		_, _ = os.Stderr.Write(stderr.Bytes())
	}
	if err != nil {
		return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
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

func pluginError(err error, stdout, stderr []byte) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("failed to run plugin: %w", err)
	}
	e := &types.Error{}
	switch {
	case len(stdout) > 0:
		if perr := json.Unmarshal(stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, perr)
		}
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %v", stderr, err)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	}
	return e
}
