package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcCPU is what /proc/<pid>/stat says of a process's CPU: its name
// (comm), its own user+system time, and that of the children it has
// reaped (cutime+cstime).
type ProcCPU struct {
	Comm           string
	Self, Children time.Duration
}

// ReadProcCPU reads /proc/<pid>/stat (the benchmarks' CPU figures).
func ReadProcCPU(pid int) (ProcCPU, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcCPU{}, err
	}
	s := string(raw)
	// comm is in parentheses and may itself hold spaces and ')'.
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 > len(s) {
		return ProcCPU{}, fmt.Errorf("/proc/%d/stat: no (comm) in %q", pid, s)
	}
	f := strings.Fields(s[end+2:]) // from field 3, state
	if len(f) < 15 {
		return ProcCPU{}, fmt.Errorf("/proc/%d/stat: %d fields after comm", pid, len(f))
	}
	tick := func(i int) time.Duration {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return time.Duration(v) * time.Second / 100 // USER_HZ
	}
	return ProcCPU{Comm: s[open+1 : end], Self: tick(11) + tick(12), Children: tick(13) + tick(14)}, nil
}
