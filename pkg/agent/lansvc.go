package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/ipam/store/etcd"
	"github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/announce"
	lbcontroller "github.com/village-cni/village/pkg/lansvc/controller"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/lansvc/members"
	"github.com/village-cni/village/pkg/lansvc/speaker"
	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// Services on the LAN ("macvlan.services", issue 39): with the key on,
// `villaged run` joins the agents' gossip on the LAN interface's address
// (pkg/lansvc/members, port 7947), answers ARP/NDP on that interface for
// the addresses it is elected for (pkg/lansvc/speaker, announce), and runs
// the controller (pkg/lansvc/controller) over the Kubernetes side's shared
// informers (Services, EndpointSlices, Nodes, Namespaces), allocating in
// the LAN pool's own store. Each agent publishes its gossip address on
// its Node (village.cni.io/lan-member) and joins those of the others.

// lanServices is the running feature, for the status file.
type lanServices struct {
	ann      *announce.Announcer
	mem      *members.Members
	ctl      *lbcontroller.Controller
	warnings []string // for the status: the IPVS one, gossip in the clear
}

// startLANServices starts the feature in wg when the network has it on.
// The LAN interface's address and the LAN pool's store may not be there
// yet (a DHCP address, the host credentials of a kubernetes store): they
// are retried until ctx is done.
func (a *agent) startLANServices(ctx context.Context, wg *sync.WaitGroup) {
	c, logf := a.c, a.opts.logf
	lan := c.Net.LAN
	if lan == nil || lan.Services == nil {
		return
	}
	side, err := a.n.kubeSide()
	if err != nil {
		logf("LAN Services: no Kubernetes API client (%v): OFF", err)
		return
	}
	wg.Go(func() {
		var ifname string
		var addr netip.Addr
		var own []netip.Addr
		var st store.Store
		if retry(ctx, a.opts, "LAN Services: finding the LAN interface, its address and the LAN pool's store", func() error {
			master, err := macvlan.ResolveMaster(lan.Master)
			if err != nil {
				return err
			}
			ifname = master.Attrs().Name
			if addr, own, err = lanAddress(ifname, lan.Sets); err != nil {
				return err
			}
			st, err = a.openLANStore()
			return err
		}) != nil {
			return // stopped while waiting
		}
		a.runLANServices(ctx, side, ifname, addr, own, st)
	})
}

// runLANServices runs members, the speaker and the controller until ctx
// is done, then closes them and st.
func (a *agent) runLANServices(ctx context.Context, side *kubeSide, ifname string, addr netip.Addr, own []netip.Addr, st store.Store) {
	c, logf := a.c, a.opts.logf
	svc := c.Net.LAN.Services
	defer st.Close()
	log := slog.New(newLogfHandler(logf, "LAN Services"))
	ls := &lanServices{}
	// The members' changes kick the speaker and the controller, made after
	// the members.
	var spk atomic.Pointer[speaker.Speaker]
	var ctl atomic.Pointer[lbcontroller.Controller]
	kick := func() {
		if s := spk.Load(); s != nil {
			s.Kick()
		}
		if c := ctl.Load(); c != nil {
			c.Kick()
		}
	}
	off := func(err error) {
		logf("LAN Services: %v: OFF", err)
		ls.offStatus(ctx, a.opts.RunDir, c.Net.Name, err)
	}
	if err := ownAddrInRanges(ifname, own, svc); err != nil {
		off(err)
		return
	}
	key, err := gossipKey(svc)
	if err != nil {
		off(err)
		return
	}
	gossip := "encrypted and authenticated"
	if key == nil {
		gossip = "IN THE CLEAR"
		ls.warnings = append(ls.warnings, GossipInTheClear)
		logf("LAN Services: WARNING: %s", GossipInTheClear)
	}
	ls.mem, err = members.Start(members.Config{Name: c.Node, Addr: addr, Key: key, OnChange: kick, Log: log})
	if err != nil {
		off(fmt.Errorf("gossip on %s: %w", addr, err))
		return
	}
	defer ls.mem.Close()
	// What the last run on this boot knew from the API server seeds the
	// members and the speaker until the informers answer: an agent
	// restarted while the control plane is down (a crash, its liveness
	// probe) still answers and fails over. The speaker probes before it
	// takes an address, and the first pass over synced informers replaces
	// the kept wants.
	kept, keptErr := readKept(a.opts.RunDir, c.Net.Name)
	switch {
	case keptErr != nil:
		logf("LAN Services: the kept state: %v (starting without)", keptErr)
	case kept != nil:
		ls.mem.SetPeers(kept.Peers)
		if kept.Nodes != nil {
			ls.mem.SetNodes(kept.Nodes)
		}
		logf("LAN Services: %d addresses and %d peers kept from %s, until the API server answers", len(kept.Wants), len(kept.Peers), kept.Time.Format(time.RFC3339))
	}
	if ls.ann, err = announce.New(announce.Config{Interface: ifname, Log: log, OnChange: kick}); err != nil {
		off(err)
		return
	}
	defer ls.ann.Close()
	if kept != nil {
		ls.ann.SetPeers(parseMACs(kept.MACs))
	}
	s, err := speaker.New(speaker.Config{Node: c.Node, Interface: ifname, Announcer: ls.ann, Members: ls.mem, Log: log})
	if err != nil {
		off(err)
		return
	}
	defer s.Close()
	if kept != nil {
		s.SetWants(kept.Wants)
	}
	spk.Store(s)
	ls.ctl, err = lbcontroller.New(lbcontroller.Config{Node: c.Node, Client: side.cs,
		Services: side.services(), EndpointSlices: side.endpointSlices(), Nodes: side.nodes(), Namespaces: side.namespaces(),
		Events: side.rec, Alloc: &alloc.Allocator{Store: st, Sets: svc.Sets}, RequireClass: svc.RequireClass,
		Live: ls.mem.Live, Alive: ls.mem.Alive, Settled: ls.mem.Settled, Speaker: s, Logf: logf,
		Holds: ls.ann.Holds, InUseBy: ls.ann.InUseBy})
	if err != nil {
		off(err)
		return
	}
	ctl.Store(ls.ctl)
	self := net.JoinHostPort(addr.String(), strconv.Itoa(members.DefaultPort))
	setPeers := func() {
		ls.mem.SetPeers(peers(side.nodes(), c.Node))
		if side.nodes().HasSynced() {
			ls.mem.SetNodes(nodeMembers(side.nodes()))
			ls.ann.SetPeers(parseMACs(peerMACs(side.nodes(), c.Node)))
		}
	}
	if _, err := side.nodes().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { setPeers() }, UpdateFunc: func(any, any) { setPeers() }, DeleteFunc: func(any) { setPeers() },
	}); err != nil {
		logf("LAN Services: %v", err)
	}
	side.start(ctx.Done())
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { ls.ctl.Run(ctx) })
	wg.Go(func() {
		// The handlers' calls before the sync set no Nodes; one after it
		// does, with no Node event needed.
		if cache.WaitForCacheSync(ctx.Done(), side.nodes().HasSynced) {
			setPeers()
		}
	})
	logf("LAN Services: Service addresses %s on %s (gossip %s, %s), requireClass %v", svc, ifname, self, gossip, svc.RequireClass)
	// Published beside the status, not before it: the status file says
	// what this node answers for even while the API server is away.
	wg.Go(func() { publishMember(ctx, side, c.Node, self, ls.ann.HardwareAddr().String(), logf) })
	ls.ipvsCheck(side, c.Node, logf)
	ls.statusLoop(ctx, a.opts.RunDir, c.Net.Name, func() *KeptLANServices {
		if !ls.ctl.Known() || !side.nodes().HasSynced() {
			return nil
		}
		return &KeptLANServices{Wants: ls.ctl.Wants(), Peers: peers(side.nodes(), c.Node), Nodes: nodeMembers(side.nodes()),
			MACs: peerMACs(side.nodes(), c.Node)}
	})
}

// lanAddress is the LAN interface's own address: the first one inside a
// LAN subnet, else its first global unicast one. own are all its global
// unicast addresses.
func lanAddress(ifname string, sets []ipamconfig.RangeSet) (addr netip.Addr, own []netip.Addr, err error) {
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

// openLANStore opens the LAN pool's store, as its IPAM plugin does.
func (a *agent) openLANStore() (store.Store, error) {
	c := a.c
	if c.LANStoreErr != nil {
		return nil, c.LANStoreErr
	}
	st := c.LANStore
	switch st.Type {
	case ipamconfig.StoreEtcd:
		return etcd.New(etcd.Options{Endpoints: st.Endpoints, CAFile: st.CAFile, CertFile: st.CertFile, KeyFile: st.KeyFile,
			Prefix: st.Prefix, Network: c.Net.Name, NodeName: c.Node})
	case ipamconfig.StoreKubernetes:
		// The store's Leases are written as the host-side village-ipam
		// identity (hostcreds.go), whose grants and admission policy are
		// exactly the Leases of the pool.
		return kube.New(kube.Options{Kubeconfig: st.Kubeconfig, Namespace: st.Namespace, Network: c.Net.Name, NodeName: c.Node})
	default:
		var d struct {
			DataDir string `json:"dataDir"`
		}
		_ = json.Unmarshal(c.Net.LAN.IPAM, &d) // validated by netconf
		return disk.New(disk.Options{DataDir: d.DataDir, Network: c.Net.Name})
	}
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
func publishMember(ctx context.Context, side *kubeSide, node, self, mac string, logf func(string, ...any)) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		kubenames.AnnotationLANMember: self, kubenames.AnnotationLANMAC: mac}}})
	for {
		_, err := side.cs.CoreV1().Nodes().Patch(ctx, node, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent}, "status")
		if err == nil || ctx.Err() != nil {
			return
		}
		logf("LAN Services: publishing the gossip address and LAN MAC on Node %s: %v (retrying)", node, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryEvery):
		}
	}
}

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

func (ls *lanServices) ipvsCheck(side *kubeSide, node string, logf func(string, ...any)) {
	warn := IPVSWarning("/sys", "/proc")
	if warn == "" {
		return
	}
	ls.warnings = append(ls.warnings, warn)
	logf("LAN Services: WARNING: %s", warn)
	side.rec.Event(&corev1.ObjectReference{Kind: "Node", Name: node, UID: ktypes.UID(node)}, corev1.EventTypeWarning, kubenames.ReasonLANIPVSNoStrictARP, warn)
}

// GossipInTheClear is the warning of an agent whose config names no
// gossip key.
const GossipInTheClear = "the agents' gossip (port 7947) is neither encrypted nor authenticated: any host on the LAN can join it and win the election of a Service address, which then goes silent; set macvlan.services.gossipKeyFile (README \"Services on the LAN\")"

// gossipKey is the key in the file svc names, nil with none named.
func gossipKey(svc *netconf.Services) ([]byte, error) {
	if svc.GossipKeyFile == "" {
		return nil, nil
	}
	return members.ReadKeyFile(svc.GossipKeyFile)
}

// LANServicesStatus is the status file: what this node answers for.
type LANServicesStatus struct {
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

// KeptLANServices is what the LAN Services last knew from the API server,
// kept in the run directory across the agent's restarts (never across a
// reboot: /run is a tmpfs).
type KeptLANServices struct {
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

// readKept reads network's kept state; nil, nil when there is none.
func readKept(runDir, network string) (*KeptLANServices, error) {
	path := nodelocal.LANServicesKept(runDir, network)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var k KeptLANServices
	if err := json.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return &k, nil
}

// statusLoop writes the status file every second until ctx is done, and
// the kept state whenever keep has one that differs from the last
// written (keep: nil until the wants are known). The kept file stays when
// the agent stops.
func (ls *lanServices) statusLoop(ctx context.Context, runDir, network string, keep func() *KeptLANServices) {
	path := nodelocal.LANServicesStatus(runDir, network)
	keptPath := nodelocal.LANServicesKept(runDir, network)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last, lastKept []byte
	for {
		if k := keep(); k != nil {
			writeChanged(keptPath, k, func() { k.Time = time.Now() }, &lastKept)
		}
		st := LANServicesStatus{Answering: ls.ann.Held(), Contested: ls.ann.Contested(), Wants: ls.ctl.Wants(), Live: ls.mem.Live(), Warnings: ls.warnings}
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
func (ls *lanServices) offStatus(ctx context.Context, runDir, network string, why error) {
	path := nodelocal.LANServicesStatus(runDir, network)
	b, _ := json.Marshal(LANServicesStatus{Time: time.Now(), Off: why.Error(), Warnings: ls.warnings})
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

// lanServicesStatus is `villaged status`'s lines about the LAN Services;
// nil when the feature is off.
func lanServicesStatus(c *Conf, runDir string) []string {
	if c.Net.LAN == nil || c.Net.LAN.Services == nil {
		return nil
	}
	b, err := os.ReadFile(nodelocal.LANServicesStatus(runDir, c.Net.Name))
	var st LANServicesStatus
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			err = errors.New("not running (is `villaged run` running?)")
		}
		return []string{fmt.Sprintf("LAN Services (%s): %v", c.Net.LAN.Services, err)}
	}
	if st.Off != "" {
		return []string{fmt.Sprintf("LAN Services (%s): OFF: %s (as of %s)", c.Net.LAN.Services, st.Off, st.Time.Format("15:04:05"))}
	}
	lines := []string{fmt.Sprintf("LAN Services (%s): answering for %d of %d addresses; live agents %v (as of %s)",
		c.Net.LAN.Services, len(st.Answering), len(st.Wants), st.Live, st.Time.Format("15:04:05"))}
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
