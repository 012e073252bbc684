package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// lab owns every namespace the benchmark makes (all named with its prefix)
// and removes them at the end, or on SIGINT/SIGTERM.
type lab struct {
	prefix string
	tmp    string

	mu    sync.Mutex
	names []string
	seq   int
}

func newLab(tmp string) *lab {
	return &lab{prefix: fmt.Sprintf("cnib%d", os.Getpid()), tmp: tmp}
}

// netnsPath is where `ip netns add` puts a namespace.
func netnsPath(name string) string { return "/run/netns/" + name }

// newNS makes a namespace with lo up and returns its name.
func (l *lab) newNS(kind string) (string, error) {
	l.mu.Lock()
	l.seq++
	name := fmt.Sprintf("%s-%s%d", l.prefix, kind, l.seq)
	l.names = append(l.names, name)
	l.mu.Unlock()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return "", fmt.Errorf("lo up in %s: %v: %s", name, err, out)
	}
	return name, nil
}

// delNS removes one namespace (links in it go with it).
func (l *lab) delNS(name string) {
	_ = exec.Command("ip", "netns", "del", name).Run()
	l.mu.Lock()
	for i, n := range l.names {
		if n == name {
			l.names = append(l.names[:i], l.names[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
}

// newPods makes n pod namespaces, a few at a time (untimed set-up).
func (l *lab) newPods(kind string, n int) ([]string, error) {
	out := make([]string, n)
	errs := make([]error, n)
	parallel(n, 4, func(i int) { out[i], errs[i] = l.newNS(kind) })
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (l *lab) delAll(names []string) {
	parallel(len(names), 4, func(i int) { l.delNS(names[i]) })
}

// cleanup removes every namespace still recorded, and the results cnitool
// cached for this run's networks (pods removed without a DEL leave them).
func (l *lab) cleanup() {
	l.mu.Lock()
	names := append([]string(nil), l.names...)
	l.mu.Unlock()
	l.delAll(names)
	left, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", l.prefix+"*"))
	for _, f := range left {
		_ = os.Remove(f)
	}
}

// parallel runs f(0..n-1) with at most width at a time.
func parallel(n, width int, f func(i int)) {
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}(i)
	}
	wg.Wait()
}

// inNS runs f on an OS thread switched into the namespace at path; processes
// f starts inherit it (the way test/e2e runs cnitool in a node).
func inNS(path string, f func() error) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	defer n.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return n.Do(func(ns.NetNS) error { return f() })
}

// suite is one plugin pair with its own binaries, conflists and cnitool cache.
type suite struct {
	name      string // "village" or "reference"
	short     string // "v" or "r"
	main      string // main plugin type
	ipam      string // IPAM plugin type
	binDir    string // CNI_PATH
	confDir   string // NETCONFPATH
	cacheDir  string // unused by cnitool v1.3.1, which keeps results in /var/lib/cni/results
	netPrefix string // network names are <lab prefix><suite>-<name>: unique, and cleaned up from cnitool's cache
	dataDir   string // ipam dataDir
	node      string // node namespace name
	cnitool   string
}

// netConf is the conflist every suite gets: the same shape, only the types
// (and the bridge and subnet, so networks in one node do not collide) differ.
func (s *suite) netConf(name, bridge, subnet string, masq bool, extra string) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":%q,"bridge":%q,"isGateway":true,"ipMasq":%v%s,
  "ipam":{"type":%q,"dataDir":%q,"subnet":%q,"routes":[{"dst":"0.0.0.0/0"}]}}]}`,
		s.netPrefix+name, s.main, bridge, masq, extra, s.ipam, s.dataDir, subnet)
}

func (s *suite) loConf() string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"%slo","plugins":[{"type":"loopback"}]}`, s.netPrefix)
}

func (s *suite) writeConf(name, body string) error {
	return os.WriteFile(filepath.Join(s.confDir, name+".conflist"), []byte(body), 0o644)
}

// pluginConf is what a runtime hands the plugin of a one-plugin conflist.
func pluginConf(list string) ([]byte, error) {
	// The lists written here have exactly one plugin; lift it out and give
	// it the list's name and cniVersion, as libcni does.
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := jsonUnmarshal([]byte(list), &l); err != nil {
		return nil, err
	}
	p := l.Plugins[0]
	p["cniVersion"], p["name"] = l.CNIVersion, l.Name
	return jsonMarshal(p)
}

// cnitoolRun runs `cnitool verb network pod` in the suite's node and
// returns how long the exec took.
func (s *suite) cnitoolRun(verb, network, pod string) (time.Duration, error) {
	d, _, err := s.cnitoolCPU(verb, network, pod)
	return d, err
}

// cnitoolCPU is cnitoolRun that also returns the CPU time (user + system)
// of cnitool and every process it waited for (the plugins, IPAM, iptables).
func (s *suite) cnitoolCPU(verb, network, pod string) (time.Duration, time.Duration, error) {
	var d, cpu time.Duration
	err := inNS(netnsPath(s.node), func() error {
		cmd := exec.Command(s.cnitool, verb, s.netPrefix+network, netnsPath(pod))
		cmd.Env = []string{
			"CNI_PATH=" + s.binDir,
			"NETCONFPATH=" + s.confDir,
			"PATH=" + os.Getenv("PATH"),
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		d = time.Since(start)
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
		if err != nil {
			return fmt.Errorf("%s: cnitool %s %s %s: %v: %s", s.name, verb, network, pod, err, strings.TrimSpace(out.String()))
		}
		return nil
	})
	return d, cpu, err
}

// execPlugin runs a plugin binary directly, as a runtime does, under
// /usr/bin/time, and returns the maximum resident set size (bytes) it
// reports: the largest of the plugin and the children it waited for. The
// plugin is forked by time (a small C program), not by this process: a
// child created with vfork from a Go program inherits that program's RSS
// high-water mark into its own ru_maxrss at exec.
func (s *suite) execPlugin(bin, verb, containerID, pod string, stdin []byte) (int64, error) {
	var rss int64
	err := inNS(netnsPath(s.node), func() error {
		f, err := os.CreateTemp("", "cnibench-time-")
		if err != nil {
			return err
		}
		f.Close()
		defer os.Remove(f.Name())
		cmd := exec.Command("/usr/bin/time", "-f", "%M", "-o", f.Name(), filepath.Join(s.binDir, bin))
		cmd.Env = []string{
			"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + containerID, "CNI_NETNS=" + netnsPath(pod),
			"CNI_IFNAME=eth0", "CNI_PATH=" + s.binDir, "PATH=" + os.Getenv("PATH"),
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %v: %s", bin, verb, err, out.String())
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return err
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("/usr/bin/time output %q: %v", b, err)
		}
		rss = kb * 1024
		return nil
	})
	return rss, err
}

// run runs a command with a deadline and returns its combined output.
func run(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ipc runs `ip args...` (10 s at most).
func ipc(args ...string) error {
	_, err := run(context.Background(), 10*time.Second, "ip", args...)
	return err
}

// ipAll runs several `ip` commands, stopping at the first failure.
func ipAll(cmds ...[]string) error {
	for _, c := range cmds {
		if err := ipc(c...); err != nil {
			return err
		}
	}
	return nil
}
