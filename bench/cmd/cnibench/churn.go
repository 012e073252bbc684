package main

import (
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
)

// churn commits one nf_tables transaction (a table added and deleted) in
// the node namespace every interval until stop is closed, as kube-proxy's
// resyncs and the agent's policy writes do on a real node: the ruleset
// generation moves under the ADDs of a burst. It returns how many
// transactions it committed.
func churn(node string, every time.Duration, stop <-chan struct{}) (<-chan int, error) {
	f, err := os.Open(netnsPath(node))
	if err != nil {
		return nil, fmt.Errorf("failed to open namespace %s: %w", node, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("failed to open nftables in %s: %w", node, err)
	}
	done := make(chan int, 1)
	go func() {
		defer f.Close()
		n := 0
		t := time.NewTicker(every)
		defer t.Stop()
		tb := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "cnibench-churn"}
		for {
			select {
			case <-stop:
				done <- n
				return
			case <-t.C:
			}
			c.AddTable(tb)
			c.DelTable(tb)
			if c.Flush() == nil {
				n++
			}
		}
	}()
	return done, nil
}

// extraKeys turns `"k":v,...` into what netConf appends ("" stays "").
func extraKeys(keys string) string {
	if keys == "" {
		return ""
	}
	return "," + keys
}
