package disk

import (
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/validate"
)

// FuzzParseRecord fuzzes the reservation file format ("<id>\r\n<ifname>",
// or a bare ID from old host-local): whatever it accepts is a valid owner,
// and every valid owner survives the round trip.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"ctr-a\r\neth0", "ctr-a", "ctr-a\r\n", "", "\r\n", "../etc\r\neth0", "a\r\nb\r\nc", "a\neth0",
		"  ctr-a\r\neth0  \n", "ctr\x00\r\neth0", "ctr\r\neth/0", strings.Repeat("x", 5000)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		o, ok := parseRecord(b)
		if !ok {
			if o != (store.Owner{}) {
				t.Fatalf("rejected record %q still yields owner %v", b, o)
			}
			return
		}
		if validate.ContainerID(o.ContainerID) != nil {
			t.Fatalf("record %q accepted with container ID %q", b, o.ContainerID)
		}
		if o.IfName != "" && validate.LinkName(o.IfName) != nil {
			t.Fatalf("record %q accepted with ifname %q", b, o.IfName)
		}
		if o.IfName != "" {
			if back, ok := parseRecord([]byte(o.ContainerID + lineBreak + o.IfName)); !ok || back != o {
				t.Fatalf("owner %v does not survive its own record: %v %v", o, back, ok)
			}
		}
	})
}

// FuzzDecodeIndex fuzzes the owner index file: no panic, and what decodes
// re-encodes to the same entries.
func FuzzDecodeIndex(f *testing.F) {
	stamp := "1:2.3:4.5"
	good := encodeIndex(stamp, map[string]entry{
		"10.0.0.2": {Owner: store.Owner{ContainerID: "a", IfName: "eth0"}},
		"fd00::2":  {Owner: store.Owner{ContainerID: "a", IfName: "eth0"}},
		"10.0.0.3": {Corrupt: true},
	})
	f.Add(good, stamp)
	f.Add(sealIndex([]byte(indexHeader+"\nstamp "+stamp+"\n")), stamp)
	f.Add([]byte("10.0.0.2\to\ta\teth0\n10.0.0.2\to\tb\teth0\n"), stamp)
	f.Add([]byte("10.0.0.2\tx\ta\teth0\n"), stamp)
	f.Add([]byte(`{"version":1,"stamp":"x","records":{}}`), "x")
	f.Fuzz(func(t *testing.T, b []byte, stamp string) {
		// As given, and as the body of a file with a matching header and
		// checksum (so the fuzzer need not guess the stamp or the sum to
		// reach the records).
		checkIndex(t, b, stamp)
		if !strings.Contains(stamp, "\n") {
			checkIndex(t, sealIndex(append([]byte(indexHeader+"\nstamp "+stamp+"\n"), b...)), stamp)
		}
	})
}

func checkIndex(t *testing.T, b []byte, stamp string) {
	t.Helper()
	m, ok := decodeIndex(b, stamp)
	if !ok {
		return
	}
	for name, e := range m {
		if e.Corrupt && e.Owner != (store.Owner{}) {
			t.Fatalf("corrupt entry %q with an owner %v", name, e.Owner)
		}
		if !e.Corrupt && e.Owner.ContainerID == "" {
			t.Fatalf("entry %q owned by nobody", name)
		}
	}
	if strings.ContainsAny(stamp, "\n") {
		t.Fatalf("accepted a stamp with a newline: %q", stamp)
	}
	back, ok := decodeIndex(encodeIndex(stamp, m), stamp)
	if !ok || !maps.Equal(back, m) {
		t.Fatalf("index %q does not survive re-encoding: %v -> %v (%v)", b, m, back, ok)
	}
}

// FuzzStoreOverDamagedFiles writes fuzzed bytes as a reservation record, the
// owner index and a round-robin marker of a real store directory, then runs
// the store over them: no panic, an address with a record file is never
// claimed again, the marker is a plain address or nothing, and GC leaves
// the valid owner's record alone.
func FuzzStoreOverDamagedFiles(f *testing.F) {
	f.Add([]byte("ctr-a\r\neth0"), []byte(""), []byte("10.0.0.2"))
	f.Add([]byte(""), []byte(indexHeader+"\nstamp x\n"), []byte("fe80::1%eth0"))
	f.Add([]byte("\x00\xff"), []byte(indexHeader+"\nstamp x\n10.0.0.9\to\tz\teth0\n"), []byte("::ffff:10.0.0.3"))
	f.Add([]byte(strings.Repeat("a", maxRecordBytes+1)), []byte("garbage"), []byte(""))
	f.Fuzz(func(t *testing.T, record, index, marker []byte) {
		root := t.TempDir()
		d, err := New(Options{DataDir: root, Network: "fz", LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		dir := filepath.Join(root, "fz")
		valid := store.Owner{ContainerID: "keep", IfName: "eth0"}
		if ok, err := d.Claim(t.Context(), store.Claim{IP: netip.MustParseAddr("10.0.0.4"), Owner: valid}); !ok || err != nil {
			t.Fatalf("claim: %v %v", ok, err)
		}
		for name, b := range map[string][]byte{"10.0.0.2": record, ".village/" + indexName: index, lastPrefix + "0": marker} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, ip := range []string{"10.0.0.2", "10.0.0.4"} {
			ok, err := d.Claim(t.Context(), store.Claim{IP: netip.MustParseAddr(ip), Owner: store.Owner{ContainerID: "other", IfName: "eth0"}})
			if ok {
				t.Fatalf("%s, which has a record file, was claimed again (record %q, index %q)", ip, record, index)
			}
			if err != nil {
				t.Fatalf("claim over damage: %v", err)
			}
		}
		last, err := d.LastReserved(t.Context(), 0)
		if err != nil {
			t.Fatalf("marker %q: %v", marker, err)
		}
		if last.IsValid() && (last.Zone() != "" || last.Is4In6()) {
			t.Fatalf("marker %q read as %v", marker, last)
		}
		if _, err := d.List(t.Context()); err != nil {
			t.Fatalf("List over damage: %v", err)
		}
		if _, err := d.GC(t.Context(), store.Valid([]store.Owner{valid})); err != nil {
			t.Fatalf("GC over damage: %v", err)
		}
		if got, err := d.ListByOwner(t.Context(), valid); err != nil || len(got) != 1 || got[0] != netip.MustParseAddr("10.0.0.4") {
			t.Fatalf("GC over damage took the valid owner's address: %v %v", got, err)
		}
	})
}
