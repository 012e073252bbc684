package lansvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/village-cni/village/pkg/lansvc/announce"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// Status is the status file (nodelocal.LANServicesStatus): what this node
// answers for.
type Status struct {
	Time      time.Time    `json:"time"`
	Off       string       `json:"off,omitempty"` // why the feature is off on this node, "" while it runs
	Answering []netip.Addr `json:"answering"`
	// Contested: addresses this node was elected for that another MAC
	// answers for (it does not).
	Contested []announce.Conflict `json:"contested,omitempty"`
	Wants     []elect.Want        `json:"wants"`
	Live      []string            `json:"live"`
	Warnings  []string            `json:"warnings,omitempty"`
}

// Kept is what the feature last knew from the API server, kept in the run
// directory (nodelocal.LANServicesKept) across the agent's restarts
// (never across a reboot: /run is a tmpfs).
type Kept struct {
	Time  time.Time    `json:"time"`
	Wants []elect.Want `json:"wants"`
	Peers []string     `json:"peers"` // the other agents' gossip addresses
	// Nodes are the Kubernetes Nodes with the gossip address each
	// published: only they count as live agents (members.SetNodes), also
	// after a restart with the API server down.
	Nodes map[string]string `json:"nodes,omitempty"`
	// MACs are the LAN MACs the other Nodes published: their frames are
	// a hand-back between nodes, no conflict (announce.SetPeers), also
	// after a restart with the API server down.
	MACs []string `json:"macs,omitempty"`
}

// GossipInTheClear is the warning of an agent whose config names no
// gossip key.
const GossipInTheClear = "the agents' gossip (port 7947) is neither encrypted nor authenticated: any host on the LAN can join it and win the election of a Service address, which then goes silent; set macvlan.services.gossipKeyFile (README \"Services on the LAN\")"

// IPVSWarning says why the node itself would answer ARP for every Service
// address (kube-proxy in IPVS mode puts them on kube-ipvs0) unless
// strictARP is set (arp_ignore 1), or "".
func IPVSWarning(sysDir, procDir string) string {
	if _, err := os.Stat(sysDir + "/class/net/kube-ipvs0"); err != nil {
		return ""
	}
	b, err := os.ReadFile(procDir + "/sys/net/ipv4/conf/all/arp_ignore")
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return ""
	}
	return "kube-proxy runs in IPVS mode without strictARP (net.ipv4.conf.all.arp_ignore is not 1): this node answers ARP for every Service address on kube-ipvs0, beside the elected announcer; set strictARP: true in kube-proxy's configuration"
}

// ReadKept reads network's kept state; nil, nil when there is none.
func ReadKept(runDir, network string) (*Kept, error) {
	var k Kept
	if found, err := nodelocal.ReadJSON(nodelocal.LANServicesKept(runDir, network), &k); !found {
		return nil, err
	}
	return &k, nil
}

// statusLoop writes the status file every second until ctx is done, and
// the kept state whenever keep has one that differs from the last
// written (keep: nil until the wants are known). The kept file stays when
// the agent stops.
func (f *feature) statusLoop(ctx context.Context, keep func() *Kept) {
	path := nodelocal.LANServicesStatus(f.cfg.RunDir, f.cfg.Network)
	keptPath := nodelocal.LANServicesKept(f.cfg.RunDir, f.cfg.Network)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last, lastKept []byte
	for {
		if k := keep(); k != nil {
			writeChanged(keptPath, k, func() { k.Time = time.Now() }, &lastKept)
		}
		st := Status{Answering: f.ann.Held(), Contested: f.ann.Contested(), Wants: f.ctl.Wants(), Live: f.mem.Live(), Warnings: f.warnings}
		writeChanged(path, &st, func() { st.Time = time.Now() }, &last)
		select {
		case <-ctx.Done():
			_ = os.Remove(path)
			return
		case <-t.C:
		}
	}
}

// offStatus writes a status file that says why the feature is off, for
// `villaged status`, and removes it when ctx is done.
func (f *feature) offStatus(ctx context.Context, why error) {
	path := nodelocal.LANServicesStatus(f.cfg.RunDir, f.cfg.Network)
	b, _ := json.Marshal(Status{Time: time.Now(), Off: why.Error(), Warnings: f.warnings})
	_ = nodelocal.WriteFile(path, b, 0o644)
	<-ctx.Done()
	_ = os.Remove(path)
}

// writeChanged writes v to path when v, before stamp sets its time,
// differs from *last (the unstamped form last written), and then records
// it in *last; a failed write is tried again next time.
func writeChanged(path string, v any, stamp func(), last *[]byte) {
	b, _ := json.Marshal(v)
	if slices.Equal(b, *last) {
		return
	}
	stamp()
	full, _ := json.Marshal(v)
	if err := nodelocal.WriteFile(path, full, 0o644); err == nil {
		*last = b
	}
}

// StatusLines are `villaged status`'s lines about the LAN Services of
// network, from its status file; svc is the network's
// "macvlan.services".
func StatusLines(svc *netconf.Services, runDir, network string) []string {
	var st Status
	found, err := nodelocal.ReadJSON(nodelocal.LANServicesStatus(runDir, network), &st)
	if !found {
		if err == nil {
			err = errors.New("not running (is `villaged run` running?)")
		}
		return []string{fmt.Sprintf("LAN Services (%s): %v", svc, err)}
	}
	if st.Off != "" {
		return []string{fmt.Sprintf("LAN Services (%s): OFF: %s (as of %s)", svc, st.Off, st.Time.Format("15:04:05"))}
	}
	lines := []string{fmt.Sprintf("LAN Services (%s): answering for %d of %d addresses; live agents %v (as of %s)",
		svc, len(st.Answering), len(st.Wants), st.Live, st.Time.Format("15:04:05"))}
	for _, a := range st.Answering {
		lines = append(lines, "  "+a.String())
	}
	lines = append(lines, contestedLines(st.Contested)...)
	for _, w := range st.Warnings {
		lines = append(lines, "LAN Services: WARNING: "+w)
	}
	return lines
}

// contestedLines are the status lines of addresses another MAC holds.
func contestedLines(cs []announce.Conflict) []string {
	var lines []string
	for _, c := range cs {
		lines = append(lines, fmt.Sprintf("  %s CONTESTED: in use by MAC %s, not answered by this node (%d conflicts, the last at %s; probed again after %s)",
			c.Addr, c.MACText, c.Conflicts, c.Last.Format("15:04:05"), c.NextProbe.Format("15:04:05")))
	}
	return lines
}
