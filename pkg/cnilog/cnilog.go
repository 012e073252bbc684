// Package cnilog gives Village's CNI plugins an optional, structured log of
// every verb they run, without ever touching stdout (which belongs to the CNI
// result) and without costing anything when logging is off.
//
// A plugin's main wraps its verbs:
//
//	skel.PluginMainFuncs(cnilog.Wrap("village", village.Funcs()), version.All, about)
//
// and a network config that sets "logFile" (an absolute path) and optionally
// "logLevel" (debug, info, warn or warning, error; default info) gets one JSON line per
// verb appended to that file:
//
//	{"time":"…","level":"INFO","msg":"ADD ok","plugin":"village","network":"village",
//	 "containerID":"8f3c…","ifname":"eth0","netns":"/var/run/netns/cni-…",
//	 "steps_ms":{"fork":0.9,"netns":0.1,…,"ipam":30.1,…},"ips":["10.244.1.5/24"],
//	 "result":"ok","duration_ms":41.2}
//
// Failures are logged at level ERROR with the CNI error code and message and
// always carry the container ID. A verb that reports its steps (Step) has
// their times in "steps_ms", so a slow ADD says where it waited. Successes
// are INFO (so logLevel warn or error keeps only failures); debug adds a
// line when the verb starts, with CNI_ARGS and the CNI version. A config
// without "logFile" costs one bytes.Contains over stdin. A log file that
// cannot be opened never fails the CNI operation: the plugin notes it on
// stderr and carries on.
package cnilog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/validate"
)

// rawConf holds the logging keys of a plugin config. They are read from the
// top level and, when the top level has none, from the "ipam" section (so an
// IPAM plugin can log on its own under a main plugin that does not).
type rawConf struct {
	Name       string `json:"name"`
	CNIVersion string `json:"cniVersion"`
	LogFile    string `json:"logFile"`
	LogLevel   string `json:"logLevel"`
	IPAM       *struct {
		LogFile  string `json:"logFile"`
		LogLevel string `json:"logLevel"`
	} `json:"ipam"`
}

var logFileKey = []byte(`"logFile"`)

// Wrap returns funcs with every verb logged when the config asks for it. name
// is the plugin's name as it appears in the log ("village", "village-ipam").
func Wrap(name string, funcs skel.CNIFuncs) skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    wrap(name, "ADD", funcs.Add),
		Del:    wrap(name, "DEL", funcs.Del),
		Check:  wrap(name, "CHECK", funcs.Check),
		GC:     wrap(name, "GC", funcs.GC),
		Status: wrap(name, "STATUS", funcs.Status),
	}
}

// stderr is where notes about the log itself go; a variable for tests.
var stderr io.Writer = os.Stderr

func wrap(plugin, verb string, f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	if f == nil {
		return nil // skel answers "not implemented" itself
	}
	return func(args *skel.CmdArgs) error {
		// The fast path: no "logFile" anywhere in the config, no work.
		if !bytes.Contains(args.StdinData, logFileKey) {
			return f(args)
		}
		logger, closeLog := open(plugin, args.StdinData)
		if logger == nil {
			return f(args)
		}
		defer closeLog()
		return run(logger, verb, args, f)
	}
}

// open reads the logging settings and opens the log; a nil logger means
// logging is off (no logFile, or it could not be opened: noted on stderr).
func open(plugin string, stdin []byte) (*slog.Logger, func()) {
	var c rawConf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, nil // the verb itself reports the bad config
	}
	file, level := c.LogFile, c.LogLevel
	if file == "" && c.IPAM != nil {
		file, level = c.IPAM.LogFile, c.IPAM.LogLevel
	}
	if file == "" {
		return nil, nil
	}
	// The shared rule: the config parsers accept exactly the levels that
	// are logged here.
	lvl, err := validate.LogLevel(level)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v; logging at info\n", plugin, err)
	}
	if !strings.HasPrefix(file, "/") {
		fmt.Fprintf(stderr, "%s: logFile %q is not an absolute path; not logging\n", plugin, file)
		return nil, nil
	}
	fh, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintf(stderr, "%s: cannot open logFile: %v; not logging\n", plugin, err)
		return nil, nil
	}
	// One Write per record: O_APPEND keeps lines from concurrent plugin
	// processes whole.
	h := slog.NewJSONHandler(&lineWriter{f: fh}, &slog.HandlerOptions{Level: lvl})
	l := slog.New(h).With("plugin", plugin, "network", c.Name)
	return l, func() { _ = fh.Close() }
}

// lineWriter hands each record to the file in a single write(2).
type lineWriter struct {
	mu sync.Mutex
	f  *os.File
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Write(p)
}

func run(logger *slog.Logger, verb string, args *skel.CmdArgs, f func(*skel.CmdArgs) error) error {
	attrs := []any{"containerID", args.ContainerID, "ifname", args.IfName}
	if args.Netns != "" {
		attrs = append(attrs, "netns", args.Netns)
	}
	debug := logger.Enabled(context.Background(), slog.LevelDebug)
	if debug {
		var v struct {
			CNIVersion string `json:"cniVersion"`
		}
		_ = json.Unmarshal(args.StdinData, &v)
		logger.Debug(verb+" start", append(attrs, "cniVersion", v.CNIVersion, "args", args.Args)...)
	}
	var captured *capture
	if verb == "ADD" && logger.Enabled(context.Background(), slog.LevelInfo) {
		captured = startCapture()
	}
	startSteps()
	start := time.Now()
	err := callSafely(f, args, captured)
	took := ms(time.Since(start))
	if st, ok := endSteps(); ok {
		attrs = append(attrs, st)
	}
	if err != nil {
		code, msg, details := describe(err)
		attrs = append(attrs, "result", "error", "code", code, "error", msg)
		if details != "" {
			attrs = append(attrs, "details", details)
		}
		logger.Error(verb+" failed", append(attrs, "duration_ms", took)...)
		return err
	}
	if captured != nil {
		if ips := captured.ips(); len(ips) > 0 {
			attrs = append(attrs, "ips", ips)
		}
	}
	logger.Info(verb+" ok", append(attrs, "result", "ok", "duration_ms", took)...)
	return nil
}

// callSafely runs the verb, always restoring stdout when it was captured.
func callSafely(f func(*skel.CmdArgs) error, args *skel.CmdArgs, c *capture) error {
	if c != nil {
		defer c.stop()
	}
	return f(args)
}

func describe(err error) (code uint, msg, details string) {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code, e.Msg, e.Details
	}
	return types.ErrInternal, err.Error(), ""
}
