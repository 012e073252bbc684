package owner

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/validate"
)

// TestTableNames: the masquerade table keeps its name, and networks x and
// policy-x (or pending-x) no longer share a table: x's policy table is not
// policy-x's masquerade table, which is what x's policy table used to be.
func TestTableNames(t *testing.T) {
	for _, tc := range []struct {
		job     Job
		network string
		want    string
	}{
		{Masquerade, "x", "village-x"},
		{Masquerade, "policy-x", "village-policy-x"},
		{Policy, "x", "village_policy-x"},
		{Pending, "x", "village_pending-x"},
		{Policy, "policy-x", "village_policy-policy-x"},
	} {
		if got := Table(tc.job, tc.network); got != tc.want {
			t.Errorf("Table(%d, %q) = %q, want %q", tc.job, tc.network, got, tc.want)
		}
	}
	// A name longer than 200 bytes is hashed, as masq.Table always did.
	long := strings.Repeat("n", 201)
	sum := sha256.Sum256([]byte(long))
	if got, want := Table(Masquerade, long), "village-"+hex.EncodeToString(sum[:8]); got != want {
		t.Errorf("Table(Masquerade, 201 bytes) = %q, want %q", got, want)
	}
	if Table(Policy, "x") == Table(Masquerade, "policy-x") || Table(Pending, "x") == Table(Masquerade, "pending-x") {
		t.Error("x's policy tables collide with the masquerade tables of policy-x / pending-x")
	}
	if Legacy(Policy, "x") != Table(Masquerade, "policy-x") || Legacy(Pending, "x") != Table(Masquerade, "pending-x") || Legacy(Masquerade, "x") != "" {
		t.Error("Legacy does not name the old, colliding tables")
	}
}

// TestTableNamesDistinct: over networks built to collide (names that are
// each other's prefixes, that spell another job's prefix, that hold '_',
// '.' and '-'), every (job, network) pair has its own table, within the
// kernel's 255 bytes.
func TestTableNamesDistinct(t *testing.T) {
	networks := []string{"x", "policy", "policy-x", "pending-x", "policy-policy-x", "pending", "village", "village_policy-x",
		"x_policy-y", "policy_x", "p", "pol.icy-x", "0", "a-", "a_", "a.", strings.Repeat("z", 200), strings.Repeat("z", 201)}
	seen := map[string]string{}
	for _, n := range networks {
		for _, job := range []Job{Masquerade, Policy, Pending} {
			name := Table(job, n)
			if len(name) > 255 {
				t.Errorf("Table(%d, %q) is %d bytes", job, n, len(name))
			}
			key := string(rune('0'+job)) + " " + n
			if other, dup := seen[name]; dup {
				t.Errorf("%q is the table of both %s and %s", name, other, key)
			}
			seen[name] = key
		}
	}
}

// FuzzTableNames: for any two valid-looking network names, a policy or
// pending table is never a masquerade table, and different networks never
// share a table of one job.
func FuzzTableNames(f *testing.F) {
	f.Add("x", "policy-x")
	f.Add("x", "pending-x")
	f.Fuzz(func(t *testing.T, a, b string) {
		if !validName(a) || !validName(b) {
			return
		}
		for _, job := range []Job{Policy, Pending} {
			if Table(job, a) == Table(Masquerade, b) {
				t.Fatalf("table %d of %q is the masquerade table of %q", job, a, b)
			}
		}
		if a != b {
			for _, job := range []Job{Masquerade, Policy, Pending} {
				if Table(job, a) == Table(job, b) {
					t.Fatalf("networks %q and %q share table %q", a, b, Table(job, a))
				}
			}
		}
		if Table(Policy, a) == Table(Pending, b) {
			t.Fatalf("policy table of %q is the pending table of %q", a, b)
		}
	})
}

func validName(s string) bool { return validate.NetworkName(s) == nil }
