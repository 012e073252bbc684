package table

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// What a per-pod chain drops is counted and sampled. Its last two rules
// (tail) are
//
//	limit rate 20/second burst 20 packets log prefix "village:in:<network>" group 22087
//	counter name "in.<ns>/<pod>" drop
//
// The counter is a named counter object of the table, one per chain with
// the chain's name, and exact: Drops reads them all in one listing. The
// log rule, which has no verdict, copies at most SampleRate packets a
// second of the chain to NFLOG group LogGroup, where the agent
// (pkg/netpol/drops) names their source and destination; the direction
// and network are in the prefix.
//
// An object outlives the rules that use it, so Update, which flushes and
// refills a chain whose rules changed, keeps its count exact (the object
// goes with its chain). Apply, which writes the whole table again, reads
// every count first and makes the new counters with it: the packets
// dropped between that read and the commit, a few milliseconds, are not
// counted (Apply runs at the agent's start and after a failure or drift
// only).

// LogGroup is the NFLOG group of the policy drop samples, 0x5647 ("VG"),
// the same for every network (the prefix names the network).
const LogGroup = 0x5647

// SampleRate is how many dropped packets a second (and how many at once)
// a per-pod chain sends to NFLOG at most.
const SampleRate = 20

// prefixLen is the longest log prefix the kernel takes (NF_LOG_PREFIXLEN
// less its NUL).
const prefixLen = 127

// logPrefix starts every prefix of the policy drop samples.
const logPrefix = "village:"

// LogPrefix is the NFLOG prefix of dir's ("ingress" or "egress") drops on
// network: "village:in:<network>" or "village:eg:<network>", cut to the
// kernel's 127 bytes (a network name that long is cut: ParsePrefix gives
// the cut name).
func LogPrefix(dir, network string) string {
	p := logPrefix + dir[:2] + ":" + network
	if len(p) > prefixLen {
		p = p[:prefixLen]
	}
	return p
}

// ParsePrefix reads LogPrefix: dir "ingress" or "egress", and the network
// (cut when it was too long).
func ParsePrefix(p string) (dir, network string, ok bool) {
	rest, ok := strings.CutPrefix(p, logPrefix)
	if !ok {
		return "", "", false
	}
	d, network, ok := strings.Cut(rest, ":")
	switch {
	case !ok:
		return "", "", false
	case d == "in":
		return "ingress", network, true
	case d == "eg":
		return "egress", network, true
	}
	return "", "", false
}

// ChainName is the kernel name of pod key's chain of dir ("ingress" or
// "egress"): "in.<ns>/<pod>", "eg.<ns>/<pod>", or a hash of the key when
// that is too long for the kernel.
func ChainName(dir, key string) string { return chainName(dir[:2], key) }

// Counts are what a drop counter counted.
type Counts struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// ChainDrops is what one per-pod chain dropped.
type ChainDrops struct {
	// Chain is the chain's kernel name.
	Chain string `json:"chain"`
	// Direction is "ingress" or "egress".
	Direction string `json:"direction"`
	// Key is the pod's namespace/name; "" when the chain's name is a hash
	// (ChainName of every pod of the Ruleset finds it).
	Key string `json:"pod,omitempty"`
	Counts
}

// Drops reads the drop counter of every per-pod chain of network's policy
// table (none when the table is missing), in the calling thread's network
// namespace: one listing of the table's counter objects.
func Drops(network string) ([]ChainDrops, error) {
	counts, err := readCounts(network)
	if err != nil {
		return nil, err
	}
	out := make([]ChainDrops, 0, len(counts))
	for _, name := range sortedKeys(counts) {
		cd := ChainDrops{Chain: name, Counts: counts[name]}
		dir, key, _ := strings.Cut(name, ".")
		cd.Direction = map[string]string{"in": "ingress", "eg": "egress"}[dir]
		if strings.Contains(key, "/") {
			cd.Key = key
		}
		out = append(out, cd)
	}
	return out, nil
}

// readCounts reads the per-pod chains' counter objects of network's
// policy table, by name.
func readCounts(network string) (map[string]Counts, error) {
	c, err := open()
	if err != nil {
		return nil, fmt.Errorf("failed to open nftables: %w", err)
	}
	name := PolicyTable(network)
	out := map[string]Counts{}
	if ok, err := tableExists(c, name); !ok {
		return out, err
	}
	objs, err := c.GetObjects(inet(name))
	if err != nil {
		return nil, fmt.Errorf("failed to list the objects of table inet %s: %w", name, err)
	}
	for _, o := range objs {
		var n string
		var cnt Counts
		switch o := o.(type) {
		case *nftables.CounterObj:
			n, cnt = o.Name, Counts{Packets: o.Packets, Bytes: o.Bytes}
		case *nftables.NamedObj:
			e, ok := o.Obj.(*expr.Counter)
			if !ok {
				continue
			}
			n, cnt = o.Name, Counts{Packets: e.Packets, Bytes: e.Bytes}
		default:
			continue
		}
		if strings.HasPrefix(n, "in.") || strings.HasPrefix(n, "eg.") {
			out[n] = cnt
		}
	}
	return out, nil
}
