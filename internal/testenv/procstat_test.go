package testenv

import (
	"os"
	"strings"
	"testing"
)

func TestReadProcCPU(t *testing.T) {
	c, err := ReadProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(comm)); c.Comm != want {
		t.Errorf("Comm = %q, want %q", c.Comm, want)
	}
	if c.Self < 0 || c.Children < 0 {
		t.Errorf("negative CPU time: %+v", c)
	}
	if _, err := ReadProcCPU(-1); err == nil {
		t.Error("ReadProcCPU(-1): no error")
	}
}
