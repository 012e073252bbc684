package kube_test

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/village-cni/village/internal/testenv"
)

// The split of a pod start for BenchmarkKubeletPodStart: where the time
// between the Create call and Ready goes, read from containerd's own log
// (the CRI calls kubelet makes) so that both plugins are split alike, and
// the CPU of the node's long-lived processes over a suite.

// podStages are the CRI calls of one pod as containerd logged them.
type podStages struct {
	sandboxBegin, sandboxEnd time.Time // RunPodSandbox called, returned
	started                  time.Time // StartContainer returned
}

var (
	crdTime      = regexp.MustCompile(`^time="([^"]+)"`)
	crdSandbox   = regexp.MustCompile(`RunPodSandbox for &PodSandboxMetadata\{Name:([^,]+),Uid:[^,]*,Namespace:([^,]+),`)
	crdSandboxID = regexp.MustCompile(`returns sandbox id \\"([0-9a-f]+)\\"`)
	crdContainer = regexp.MustCompile(`CreateContainer within sandbox \\"([0-9a-f]+)\\" for &ContainerMetadata\{[^}]*\} returns container id \\"([0-9a-f]+)\\"`)
	crdStarted   = regexp.MustCompile(`StartContainer for \\"([0-9a-f]+)\\" returns successfully`)
)

// containerdStages reads containerd's log from offset and returns the
// stages of the pods of namespace by pod name.
func containerdStages(path string, offset int64, namespace string) (map[string]*podStages, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	pods := map[string]*podStages{}
	bySandbox := map[string]*podStages{}
	byContainer := map[string]*podStages{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		m := crdTime.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		if m := crdSandbox.FindStringSubmatch(l); m != nil && m[2] == namespace {
			p := pods[m[1]]
			if p == nil {
				p = &podStages{}
				pods[m[1]] = p
			}
			if id := crdSandboxID.FindStringSubmatch(l); id != nil {
				p.sandboxEnd = at
				bySandbox[id[1]] = p
			} else if p.sandboxBegin.IsZero() {
				p.sandboxBegin = at
			}
			continue
		}
		if m := crdContainer.FindStringSubmatch(l); m != nil {
			if p := bySandbox[m[1]]; p != nil {
				byContainer[m[2]] = p
			}
			continue
		}
		if m := crdStarted.FindStringSubmatch(l); m != nil {
			if p := byContainer[m[1]]; p != nil && p.started.IsZero() {
				p.started = at
			}
		}
	}
	return pods, sc.Err()
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// cpuByComm is the CPU time (user+system) of every process whose name is
// one of comms, and separately that of the children they have reaped
// (cutime+cstime: for containerd, the CNI plugins it exec'd and what they
// exec'd in turn), by name.
func cpuByComm(comms ...string) (self, children map[string]time.Duration) {
	self, children = map[string]time.Duration{}, map[string]time.Duration{}
	want := map[string]bool{}
	for _, c := range comms {
		want[c] = true
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		c, err := testenv.ReadProcCPU(pid)
		if err != nil || !want[c.Comm] {
			continue // gone meanwhile, or not one of comms
		}
		self[c.Comm] += c.Self
		children[c.Comm] += c.Children
	}
	return self, children
}

// busyCPU is the machine's non-idle CPU time so far (/proc/stat).
func busyCPU() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(raw), "\n", 2)[0])
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100
}

// suiteCPU is the CPU the node's processes used between two samples.
type suiteCPU struct {
	self, children map[string]time.Duration
	busy           time.Duration
}

var cpuComms = []string{"villaged", "kubelet", "containerd", "kube-proxy", "kube-apiserver", "etcd"}

func sampleCPU() suiteCPU {
	s, c := cpuByComm(cpuComms...)
	return suiteCPU{self: s, children: c, busy: busyCPU()}
}

// since formats the CPU used after s0 up to s1, one name=self(+children).
func (s1 suiteCPU) since(s0 suiteCPU) string {
	var b strings.Builder
	fmt.Fprintf(&b, "machine=%v", (s1.busy - s0.busy).Round(10*time.Millisecond))
	for _, c := range cpuComms {
		fmt.Fprintf(&b, " %s=%v", c, (s1.self[c] - s0.self[c]).Round(10*time.Millisecond))
		if d := s1.children[c] - s0.children[c]; d > 0 {
			fmt.Fprintf(&b, "(+children %v)", d.Round(10*time.Millisecond))
		}
	}
	return b.String()
}

// pluginLine is the part of a Village plugin's log line (pkg/cnilog) the
// benchmark reads.
type pluginLine struct {
	Time        time.Time          `json:"time"`
	Msg         string             `json:"msg"`
	Plugin      string             `json:"plugin"`
	ContainerID string             `json:"containerID"`
	DurationMS  float64            `json:"duration_ms"`
	StepsMS     map[string]float64 `json:"steps_ms"`
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// addSteps gathers the step times of the suite's successful ADDs per
// plugin, to say where the slow ones waited.
type addSteps struct {
	times map[string]map[string][]time.Duration // plugin -> step -> times
	lines map[string][]pluginLine
}

func (s *addSteps) add(l pluginLine) {
	if s.times == nil {
		s.times, s.lines = map[string]map[string][]time.Duration{}, map[string][]pluginLine{}
	}
	if s.times[l.Plugin] == nil {
		s.times[l.Plugin] = map[string][]time.Duration{}
	}
	s.lines[l.Plugin] = append(s.lines[l.Plugin], l)
	for name, ms := range l.StepsMS {
		s.times[l.Plugin][name] = append(s.times[l.Plugin][name], msDuration(ms))
	}
}

// print writes, per plugin, each step's p50/p99/max over the suite and the
// three slowest ADDs with their steps and when they ended.
func (s *addSteps) print(suite string) {
	for _, p := range slices.Sorted(maps.Keys(s.lines)) {
		var b strings.Builder
		for _, name := range slices.Sorted(maps.Keys(s.times[p])) {
			d := s.times[p][name]
			fmt.Fprintf(&b, " %s=%v/%v/%v", name, pct(d, 50), pct(d, 99), pct(d, 100))
		}
		fmt.Printf("FIGURE kubelet %s %s ADD steps p50/p99/max (n=%d):%s\n", suite, p, len(s.lines[p]), b.String())
		slow := slices.Clone(s.lines[p])
		slices.SortFunc(slow, func(x, y pluginLine) int { return cmp.Compare(y.DurationMS, x.DurationMS) })
		for _, l := range slow[:min(3, len(slow))] {
			var st []string
			for name, ms := range l.StepsMS {
				if ms >= 1 {
					st = append(st, fmt.Sprintf("%s=%.0fms", name, ms))
				}
			}
			slices.Sort(st)
			fmt.Printf("FIGURE kubelet %s %s slow ADD %.12s ended %s took %v: %s\n", suite, p, l.ContainerID,
				l.Time.Format("15:04:05.000"), msDuration(l.DurationMS).Round(time.Millisecond), strings.Join(st, " "))
		}
	}
}
