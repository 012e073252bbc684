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
//	counter packets N bytes M drop
//
// The counter is exact: Drops reads it. The log rule, which has no
// verdict, copies at most SampleRate packets a second of the chain to
// NFLOG group LogGroup, where the agent (pkg/netpol/drops) names their
// source and destination; the direction and network are in the prefix.
//
// A counter lives as long as its rule, so the rewrites keep it: Update
// refills a chain whose rules changed by replacing the rules before its
// tail and keeps the tail itself (the count stays exact), and Apply, which
// writes the whole table again, reads every chain's count first and gives
// the new drop rule that count (the packets dropped between that read and
// the commit, a few milliseconds, are not counted; Apply runs at the
// agent's start and after a failure or drift only).

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
// namespace.
func Drops(network string) ([]ChainDrops, error) {
	tails, err := readTails(network, nil)
	if err != nil {
		return nil, err
	}
	out := make([]ChainDrops, 0, len(tails))
	for _, name := range sortedKeys(tails) {
		tl := tails[name]
		if !tl.counted {
			continue
		}
		cd := ChainDrops{Chain: name, Counts: tl.counts}
		dir, key, _ := strings.Cut(name, ".")
		cd.Direction = map[string]string{"in": "ingress", "eg": "egress"}[dir]
		if strings.Contains(key, "/") {
			cd.Key = key
		}
		out = append(out, cd)
	}
	return out, nil
}

// chainTail is what the kernel holds of a per-pod chain: the drop
// counter's count (counted: the chain ends in a counted drop) and, ok
// when the chain ends in a whole tail, the handle of the tail's first
// rule and those of the rules before it.
type chainTail struct {
	counts  Counts
	counted bool
	clauses []uint64
	first   uint64
	ok      bool
}

// readTails reads the per-pod chains of network's policy table (only
// those named in names, when not nil): one rule listing per chain (the
// kernel lists the rules of a table only chain by chain), all on one
// socket (a Conn that is not lasting opens one per listing).
func readTails(network string, names []string) (map[string]chainTail, error) {
	name := PolicyTable(network)
	out := map[string]chainTail{}
	if names != nil && len(names) == 0 {
		return out, nil
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("failed to open nftables: %w", err)
	}
	defer func() { _ = c.CloseLasting() }()
	if names == nil {
		if ok, err := tableExists(c, name); !ok {
			return out, err
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			return nil, fmt.Errorf("failed to list nftables chains: %w", err)
		}
		for _, ch := range chains {
			if ch.Table.Name == name && (strings.HasPrefix(ch.Name, "in.") || strings.HasPrefix(ch.Name, "eg.")) {
				names = append(names, ch.Name)
			}
		}
	}
	t := inet(name)
	for _, ch := range names {
		rules, err := c.GetRules(t, &nftables.Chain{Name: ch, Table: t})
		if err != nil {
			return nil, fmt.Errorf("failed to list the rules of chain %s of table inet %s: %w", ch, name, err)
		}
		out[ch] = tailOf(rules)
	}
	return out, nil
}

// tailOf recognises the tail of a chain's rules (a chain written before
// the samples ends in the counted drop alone: counted, not ok).
func tailOf(rules []*nftables.Rule) chainTail {
	var tl chainTail
	n := len(rules)
	if n == 0 || len(rules[n-1].Exprs) != 2 {
		return tl
	}
	last := rules[n-1].Exprs
	cnt, ok := last[0].(*expr.Counter)
	v, isVerdict := last[1].(*expr.Verdict)
	if !ok || !isVerdict || v.Kind != expr.VerdictDrop {
		return tl
	}
	tl.counts, tl.counted = Counts{Packets: cnt.Packets, Bytes: cnt.Bytes}, true
	if n < tailLen || !isLog(rules[n-2]) {
		return tl
	}
	for _, r := range rules[:n-tailLen] {
		tl.clauses = append(tl.clauses, r.Handle)
	}
	tl.first, tl.ok = rules[n-2].Handle, true
	return tl
}

func isLog(r *nftables.Rule) bool {
	for _, e := range r.Exprs {
		if l, ok := e.(*expr.Log); ok && l.Group == LogGroup {
			return true
		}
	}
	return false
}

// counts are the drop counts of tails by chain.
func counts(tails map[string]chainTail) map[string]Counts {
	out := make(map[string]Counts, len(tails))
	for name, tl := range tails {
		if tl.counted {
			out[name] = tl.counts
		}
	}
	return out
}
