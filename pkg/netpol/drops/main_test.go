package drops

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/nodelocal"
)

// TestMain serves as a child (testenv.StartChild) when started as one:
// the benchmarks run the NFLOG listener in a process of its own, in the
// node's namespace, to measure its CPU apart from the traffic's senders.
func TestMain(m *testing.M) {
	if testenv.IsChild() {
		serveListener()
		return
	}
	os.Exit(m.Run())
}

// listenCmd starts Run in the child on network's samples, named with the
// model file of RunDir.
type listenCmd struct {
	RunDir, Network string
}

// listenAnswer is the child's pid, or why it could not start.
type listenAnswer struct {
	Pid   int
	Error string
}

func serveListener() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testenv.ServeChild(func(line []byte) (any, bool) {
		var c listenCmd
		if err := json.Unmarshal(line, &c); err != nil {
			return listenAnswer{Error: err.Error()}, true
		}
		var m netpol.Model
		if _, err := nodelocal.ReadJSON(nodelocal.PolicyModel(c.RunDir, c.Network), &m); err != nil {
			return listenAnswer{Error: err.Error()}, true
		}
		rec := NewRecorder(c.Network, 0)
		rec.SetModel(&m)
		go func() {
			if err := Run(ctx, Config{Network: c.Network, RunDir: c.RunDir, Recorder: rec}); err != nil {
				os.Stderr.WriteString("listener: " + err.Error() + "\n")
			}
		}()
		return listenAnswer{Pid: os.Getpid()}, false
	})
}
