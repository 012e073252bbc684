// Package lansvc puts LoadBalancer Services on the LAN: each Service of
// an allowed namespace gets an address from the LAN pool, and one node at
// a time answers ARP and NDP for it on the LAN interface, so a home-lab
// service is reached on the LAN at its own address, not told apart by a
// NodePort. Run is the whole feature on one node; the agent hands it the
// LAN interface, the LAN pool's store and its Kubernetes side, and
// nothing else of the agent's.
//
// # The parts
//
//	members     who is alive on the LAN: gossip (memberlist) on the LAN
//	            interface's own address, under the gossip key
//	elect       which live, eligible node answers for each address:
//	            rendezvous hashing, the same on every agent (pure)
//	announce    the answering itself: ARP and NDP in user space on the LAN
//	            interface, probes before a takeover, conflict resolution
//	speaker     members + elect + announce, from the last known wants; no
//	            API server on the path, so failover goes on without it
//	alloc       the addresses, in the LAN pool's own store (a pod and a
//	            Service never share one)
//	plan        the controller's pure core: groups, writers, what to
//	            allocate, refusals, releases, wants and announcements from
//	            one picture of the cluster (no API server, store or clock)
//	controller  the Kubernetes side around plan: informers, allocations,
//	            status, Events, the wants handed to the speaker
//
// # What one node does
//
// Run starts the gossip, seeds it and the speaker from the state kept in
// the run directory by the last run on this boot (an agent restarted
// while the control plane is down still answers and fails over), then the
// controller over the agent's shared informers. Every agent publishes its
// gossip address and its LAN MAC on its Node (village.cni.io/lan-member,
// village.cni.io/lan-mac): only Nodes' agents at the address they
// published count as members, and the other Nodes' MACs answering for an
// address are a hand-back between nodes, never a conflict. Run writes the
// status file (what this node answers for, for `villaged status`) every
// second, also while the API server is away, and the kept state whenever
// what it knows from the API server changes.
package lansvc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/announce"
	"github.com/village-cni/village/pkg/lansvc/controller"
	"github.com/village-cni/village/pkg/lansvc/members"
	"github.com/village-cni/village/pkg/lansvc/speaker"
	"github.com/village-cni/village/pkg/netconf"
)

// Kube is what the feature needs of the agent's Kubernetes side: its one
// client, its shared informers (never the factory: the agent starts them,
// Run only adds its handlers) and its Event recorder.
type Kube struct {
	Client                                      kubernetes.Interface
	Services, EndpointSlices, Nodes, Namespaces cache.SharedIndexInformer
	Events                                      record.EventRecorder
}

// Config is what Run needs.
type Config struct {
	Node     string // this node's name (its Node's)
	Network  string // the village network's name: the status files' directory
	RunDir   string // the run directory ("" is nodelocal's default)
	Services *netconf.Services
	// Interface is the LAN interface (the macvlan master); Addr is its
	// address the gossip binds (LANAddress), Own all its global ones.
	Interface string
	Addr      netip.Addr
	Own       []netip.Addr
	// Store is the LAN pool's store; Run closes it.
	Store store.Store
	Kube  Kube
	// Log receives the parts' records; Logf the feature's own lines.
	Log  *slog.Logger
	Logf func(format string, args ...any)
	// Retry is the pause between attempts to publish on the Node.
	Retry time.Duration
}

// Run runs the feature until ctx is done, then stops answering and
// closes the store. A setting that cannot work (a range holding the
// node's own address, an unreadable gossip key, a socket that cannot
// open) turns the feature off on this node: the status file says why.
func Run(ctx context.Context, cfg Config) {
	defer cfg.Store.Close()
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	f := &feature{cfg: cfg}
	if err := f.start(ctx); err != nil {
		cfg.Logf("LAN Services: %v: OFF", err)
		f.offStatus(ctx, err)
		return
	}
	defer f.close()
	f.run(ctx)
}

// feature is the running feature on one node.
type feature struct {
	cfg      Config
	ann      *announce.Announcer
	mem      *members.Members
	spk      *speaker.Speaker
	ctl      *controller.Controller
	kept     *Kept    // what the last run on this boot kept; nil: none
	gossip   string   // how the gossip is protected, for the log
	warnings []string // for the status: the IPVS one, gossip in the clear

	closers []func() error
}

// start makes the parts, members first: their changes kick the speaker
// and the controller, made after them.
func (f *feature) start(ctx context.Context) (err error) {
	cfg, svc := f.cfg, f.cfg.Services
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	var spk atomic.Pointer[speaker.Speaker]
	var ctl atomic.Pointer[controller.Controller]
	kick := func() {
		if s := spk.Load(); s != nil {
			s.Kick()
		}
		if c := ctl.Load(); c != nil {
			c.Kick()
		}
	}
	if err := ownAddrInRanges(cfg.Interface, cfg.Own, svc); err != nil {
		return err
	}
	key, err := gossipKey(svc)
	if err != nil {
		return err
	}
	f.gossip = "encrypted and authenticated"
	if key == nil {
		f.gossip = "IN THE CLEAR"
		f.warnings = append(f.warnings, GossipInTheClear)
		cfg.Logf("LAN Services: WARNING: %s", GossipInTheClear)
	}
	if f.mem, err = members.Start(members.Config{Name: cfg.Node, Addr: cfg.Addr, Key: key, OnChange: kick, Log: cfg.Log}); err != nil {
		return fmt.Errorf("gossip on %s: %w", cfg.Addr, err)
	}
	f.closers = append(f.closers, f.mem.Close)
	// What the last run on this boot knew from the API server seeds the
	// members, the announcer and the speaker until the informers answer.
	// The speaker probes before it takes an address, and the first pass
	// over synced informers replaces the kept wants.
	kept, keptErr := ReadKept(cfg.RunDir, cfg.Network)
	switch {
	case keptErr != nil:
		cfg.Logf("LAN Services: the kept state: %v (starting without)", keptErr)
	case kept != nil:
		f.kept = kept
		f.mem.SetPeers(kept.Peers)
		if kept.Nodes != nil {
			f.mem.SetNodes(kept.Nodes)
		}
		cfg.Logf("LAN Services: %d addresses and %d peers kept from %s, until the API server answers", len(kept.Wants), len(kept.Peers), kept.Time.Format(time.RFC3339))
	}
	if f.ann, err = announce.New(announce.Config{Interface: cfg.Interface, Log: cfg.Log, OnChange: kick}); err != nil {
		return err
	}
	f.closers = append(f.closers, f.ann.Close)
	if kept != nil {
		f.ann.SetPeers(parseMACs(kept.MACs))
	}
	if f.spk, err = speaker.New(speaker.Config{Node: cfg.Node, Interface: cfg.Interface, Announcer: f.ann, Members: f.mem, Log: cfg.Log}); err != nil {
		return err
	}
	f.closers = append(f.closers, f.spk.Close)
	if kept != nil {
		f.spk.SetWants(kept.Wants)
	}
	spk.Store(f.spk)
	k := cfg.Kube
	f.ctl, err = controller.New(controller.Config{Node: cfg.Node, Client: k.Client,
		Services: k.Services, EndpointSlices: k.EndpointSlices, Nodes: k.Nodes, Namespaces: k.Namespaces,
		Events: k.Events, Alloc: &alloc.Allocator{Store: cfg.Store, Sets: svc.Sets}, RequireClass: svc.RequireClass,
		Live: f.mem.Live, Alive: f.mem.Alive, Settled: f.mem.Settled, Speaker: f.spk, Logf: cfg.Logf,
		Holds: f.ann.Holds, InUseBy: f.ann.InUseBy})
	if err != nil {
		return err
	}
	ctl.Store(f.ctl)
	return nil
}

// close closes what start made, the last first (the speaker answers for
// nothing before the announcer's sockets close).
func (f *feature) close() {
	for i := len(f.closers) - 1; i >= 0; i-- {
		_ = f.closers[i]()
	}
	f.closers = nil
}

// run follows the Nodes, runs the controller, publishes this node's
// gossip address and writes the status until ctx is done.
func (f *feature) run(ctx context.Context) {
	cfg, k := f.cfg, f.cfg.Kube
	self := net.JoinHostPort(cfg.Addr.String(), strconv.Itoa(members.DefaultPort))
	setPeers := func() {
		f.mem.SetPeers(peers(k.Nodes, cfg.Node))
		if k.Nodes.HasSynced() {
			f.mem.SetNodes(nodeMembers(k.Nodes))
			f.ann.SetPeers(parseMACs(peerMACs(k.Nodes, cfg.Node)))
		}
	}
	if _, err := k.Nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { setPeers() }, UpdateFunc: func(any, any) { setPeers() }, DeleteFunc: func(any) { setPeers() },
	}); err != nil {
		cfg.Logf("LAN Services: %v", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { f.ctl.Run(ctx) })
	wg.Go(func() {
		// The handlers' calls before the sync set no Nodes; one after it
		// does, with no Node event needed.
		if cache.WaitForCacheSync(ctx.Done(), k.Nodes.HasSynced) {
			setPeers()
		}
	})
	cfg.Logf("LAN Services: Service addresses %s on %s (gossip %s, %s), requireClass %v", cfg.Services, cfg.Interface, self, f.gossip, cfg.Services.RequireClass)
	// Published beside the status, not before it: the status file says
	// what this node answers for even while the API server is away.
	wg.Go(func() { f.publishMember(ctx, self, f.ann.HardwareAddr().String()) })
	f.ipvsCheck()
	f.statusLoop(ctx, func() *Kept {
		if !f.ctl.Known() || !k.Nodes.HasSynced() {
			return nil
		}
		return &Kept{Wants: f.ctl.Wants(), Peers: peers(k.Nodes, cfg.Node), Nodes: nodeMembers(k.Nodes),
			MACs: peerMACs(k.Nodes, cfg.Node)}
	})
}

// LANAddress is the LAN interface's own address: the first one inside a
// LAN subnet, else its first global unicast one. own are all its global
// unicast addresses.
func LANAddress(ifname string, sets []ipamconfig.RangeSet) (addr netip.Addr, own []netip.Addr, err error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("LAN interface %s: %w", ifname, err)
	}
	as, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("LAN interface %s: %w", ifname, err)
	}
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().IsGlobalUnicast() {
			own = append(own, p.Addr().Unmap())
		}
	}
	for _, ip := range own {
		for _, set := range sets {
			for _, r := range set {
				if r.Subnet.Contains(ip) {
					return ip, own, nil
				}
			}
		}
	}
	if len(own) == 0 {
		return netip.Addr{}, nil, fmt.Errorf("LAN interface %s has no global address to gossip from", ifname)
	}
	return own[0], own, nil
}

// ownAddrInRanges refuses Service ranges that could hand out one of the
// node's own LAN addresses (own): a Service given it would take the
// node's traffic on the LAN, and the speaker would answer for it.
func ownAddrInRanges(ifname string, own []netip.Addr, svc *netconf.Services) error {
	for _, ip := range own {
		for _, set := range svc.Sets {
			for _, r := range set {
				if r.Allocatable(ip) {
					return fmt.Errorf("\"macvlan.services.ranges\": %s holds this node's own address %s (on %s): take it out of the range", r, ip, ifname)
				}
			}
		}
	}
	return nil
}

// peers are the other agents' gossip addresses, from their Nodes.
func peers(nodes cache.SharedIndexInformer, self string) []string {
	return othersAnnotation(nodes, self, kubenames.AnnotationLANMember)
}

// peerMACs are the LAN MACs the other Nodes published
// (village.cni.io/lan-mac), sorted.
func peerMACs(nodes cache.SharedIndexInformer, self string) []string {
	return othersAnnotation(nodes, self, kubenames.AnnotationLANMAC)
}

// othersAnnotation is the annotation key of every Node but self that has
// it, sorted.
func othersAnnotation(nodes cache.SharedIndexInformer, self, key string) []string {
	var out []string
	for _, obj := range nodes.GetStore().List() {
		n, ok := obj.(*corev1.Node)
		if !ok || n.Name == self {
			continue
		}
		if v := n.Annotations[key]; v != "" {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// parseMACs parses the Ethernet MACs among macs; anything else a Node
// carries there is no MAC of a peer, and is left out.
func parseMACs(macs []string) []net.HardwareAddr {
	var out []net.HardwareAddr
	for _, s := range macs {
		if m, err := net.ParseMAC(s); err == nil && len(m) == 6 {
			out = append(out, m)
		}
	}
	return out
}

// nodeMembers are the Nodes, each with the gossip address it published
// ("" while none), for members.SetNodes.
func nodeMembers(nodes cache.SharedIndexInformer) map[string]string {
	out := map[string]string{}
	for _, obj := range nodes.GetStore().List() {
		if n, ok := obj.(*corev1.Node); ok {
			out[n.Name] = n.Annotations[kubenames.AnnotationLANMember]
		}
	}
	return out
}

// publishMember writes this node's gossip address and its LAN interface's
// MAC on its Node (a merge patch through nodes/status, as the kubernetes
// registry does), retrying until they are there.
func (f *feature) publishMember(ctx context.Context, self, mac string) {
	cfg := f.cfg
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		kubenames.AnnotationLANMember: self, kubenames.AnnotationLANMAC: mac}}})
	for {
		_, err := cfg.Kube.Client.CoreV1().Nodes().Patch(ctx, cfg.Node, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent}, "status")
		if err == nil || ctx.Err() != nil {
			return
		}
		cfg.Logf("LAN Services: publishing the gossip address and LAN MAC on Node %s: %v (retrying)", cfg.Node, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.Retry):
		}
	}
}

func (f *feature) ipvsCheck() {
	warn := IPVSWarning("/sys", "/proc")
	if warn == "" {
		return
	}
	f.warnings = append(f.warnings, warn)
	f.cfg.Logf("LAN Services: WARNING: %s", warn)
	f.cfg.Kube.Events.Event(&corev1.ObjectReference{Kind: "Node", Name: f.cfg.Node, UID: ktypes.UID(f.cfg.Node)}, corev1.EventTypeWarning, kubenames.ReasonLANIPVSNoStrictARP, warn)
}

// gossipKey is the key in the file svc names, nil with none named.
func gossipKey(svc *netconf.Services) ([]byte, error) {
	if svc.GossipKeyFile == "" {
		return nil, nil
	}
	return members.ReadKeyFile(svc.GossipKeyFile)
}
