package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/overlay"
)

// Kept peers: the overlay's last view of the registry, kept in the run
// directory (nodelocal.OverlayPeers, on this boot only), so that an agent
// restarted while the registry cannot be reached (the API server or etcd
// down or hung) programs its peers again from it. That matters most for
// the wireguard backend's userspace device, which goes with the agent and
// its peers and routes with it; vxlan's and host-gw's kernel objects stay
// in the kernel across a restart anyway. The registry's first list
// replaces the kept view whole (a sweep, as any first list), so a peer
// that left meanwhile goes as soon as the registry answers.

// keptAfter is how long the loop waits for the registry's first list
// before it programs the kept peers when the pod subnets come from the
// config (so the registry was not asked yet): a registry that answers does
// so in well under a second, so the kept view is not programmed for
// nothing. When the node leases its subnets, the kept peers are used only
// when the registry did not answer for them, and then at once.
const keptAfter = 3 * time.Second

// keepEvery is the longest the kept file lags the view: changes within it
// are written together, so a burst of registry events costs one write.
const keepEvery = time.Second

// keptPeers is the kept file's content.
type keptPeers struct {
	Node    string         `json:"node"`
	Network string         `json:"network"`
	Time    time.Time      `json:"time"`
	Peers   []overlay.Node `json:"peers"`
}

// writeKept writes the registry's peers of the view (not the static
// ones, which the config gives again) to the kept file.
func (a *agent) writeKept() {
	static := peerMap(a.c.staticPeers())
	k := keptPeers{Node: a.c.Node, Network: a.c.Net.Name, Time: time.Now()}
	for _, p := range peerList(a.view) {
		if _, ok := static[p.Name]; !ok {
			k.Peers = append(k.Peers, p)
		}
	}
	path := nodelocal.OverlayPeers(a.opts.RunDir, a.c.Net.Name)
	b, err := json.Marshal(&k)
	if err == nil {
		err = nodelocal.WriteFile(path, b, 0o600)
	}
	if err != nil {
		a.opts.logf("keeping the overlay's peers in %s: %v", path, err)
	}
}

// readKept reads the kept peers of this node and network; nil when there
// are none (or they are another node's or network's).
func (a *agent) readKept() ([]overlay.Node, time.Time, error) {
	var k keptPeers
	path := nodelocal.OverlayPeers(a.opts.RunDir, a.c.Net.Name)
	found, err := nodelocal.ReadJSON(path, &k)
	if !found || k.Node != a.c.Node || k.Network != a.c.Net.Name {
		return nil, time.Time{}, err
	}
	return k.Peers, k.Time, nil
}

// seedKept makes the kept peers the view, as a first list would, and
// runs the first pass on them; nothing when there are none. The
// registry's first list after it is still a first list (a sweep).
func (a *agent) seedKept(ctx context.Context) {
	peers, at, err := a.readKept()
	if err != nil {
		a.opts.logf("the registry has not answered: %v", err)
		return
	}
	if peers == nil {
		a.opts.logf("the registry has not answered, and no peers are kept on this boot: waiting for it")
		return
	}
	a.view = peerMap(mergePeers(a.c.staticPeers(), peers))
	a.haveView, a.fromKept = true, true
	why := fmt.Sprintf("the registry has not answered: %d peers kept at %s", len(peers), at.Format(time.RFC3339))
	a.opts.logf("%s; the registry's first list will replace them", why)
	a.pass(ctx, why+" (sweep)", false)
	a.masq.keep()
}
