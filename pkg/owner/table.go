package owner

import (
	"crypto/sha256"
	"encoding/hex"
)

// Job is what one of a network's nftables tables is for.
type Job int

const (
	// Masquerade is pkg/masq's table: masquerade and forward accept
	// (family inet), the pods' macspoofchk rules (family bridge).
	Masquerade Job = iota
	// Policy is NetworkPolicy's compiled rules (pkg/netpol/table).
	Policy
	// Pending is NetworkPolicy's marks of pods not compiled yet.
	Pending
)

// longName is the longest network name written into a table name as it
// is; a longer one is hashed (the kernel allows 255 bytes, and
// validate.MaxNetworkName keeps valid names at or below it).
const longName = 200

// Table is the name of network's nftables table for job: the one namer
// of Village's tables, so that no two (job, network) pairs share a table.
//
//   - Masquerade: village-<network>, the name it has always had, so the
//     rules of nodes installed before stay where Village looks for them.
//   - Policy, Pending: village_policy-<network>, village_pending-<network>.
//
// A network name starts with a letter or a digit (validate.NetworkName),
// so a masquerade table never has the '_' after "village" that the other
// jobs have, and the other jobs' fixed prefixes end in '-' before the
// name: the name of any table gives back its job and network. (Before
// this scheme the policy tables were village-policy-<network> and
// village-pending-<network>, which are the masquerade tables of networks
// "policy-<network>" and "pending-<network>": see Legacy.)
func Table(job Job, network string) string {
	if len(network) > longName {
		sum := sha256.Sum256([]byte(network))
		network = hex.EncodeToString(sum[:8])
	}
	switch job {
	case Policy:
		return "village_policy-" + network
	case Pending:
		return "village_pending-" + network
	}
	return "village-" + network
}

// Legacy is the name network's table of job had before Table's scheme,
// "" when it has not changed (Masquerade). Such a table may instead be
// another network's masquerade table: whoever removes one checks it is
// its own first.
func Legacy(job Job, network string) string {
	switch job {
	case Policy:
		return "village-policy-" + network
	case Pending:
		return "village-pending-" + network
	}
	return ""
}
