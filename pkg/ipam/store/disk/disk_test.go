package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/storetest"
)

var ctx = context.Background()

func open(t *testing.T, root string) *Disk {
	t.Helper()
	d, err := New(Options{DataDir: root, Network: "net1", LockTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, t.TempDir()) })
}

func claim(t *testing.T, d *Disk, ip string, o store.Owner, set int) bool {
	t.Helper()
	ok, err := d.Claim(ctx, store.Claim{IP: netip.MustParseAddr(ip), Owner: o, RangeSet: set})
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

var ownerA = store.Owner{ContainerID: "ctr-a", IfName: "eth0"}

func TestOnDiskFormatAndModes(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	d := open(t, root)
	claim(t, d, "10.0.0.2", ownerA, 0)
	claim(t, d, "fd00::2", ownerA, 1)
	dir := filepath.Join(root, "net1")
	for path, want := range map[string]string{
		"10.0.0.2":           "ctr-a\r\neth0",
		"fd00::2":            "ctr-a\r\neth0",
		"last_reserved_ip.0": "10.0.0.2",
		"last_reserved_ip.1": "fd00::2",
	} {
		b, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
		if fi, _ := os.Stat(filepath.Join(dir, path)); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", path, fi.Mode())
		}
	}
	for _, p := range []string{root, dir, filepath.Join(dir, metaName)} {
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o700 {
			t.Errorf("%s mode %v, want 0700", p, fi.Mode())
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "lock")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock: %v %v", fi, err)
	}
	// No temp files are left.
	ents, _ := os.ReadDir(filepath.Join(dir, metaName))
	for _, e := range ents {
		if e.Name() != indexName {
			t.Errorf("left behind %s", e.Name())
		}
	}
}

func TestBadNames(t *testing.T) {
	for _, n := range []string{"", "..", ".", "../x", "a/b", "a\x00b", strings.Repeat("a", 201)} {
		if _, err := New(Options{DataDir: t.TempDir(), Network: n}); err == nil {
			t.Errorf("network %q accepted", n)
		}
	}
	d := open(t, t.TempDir())
	for _, o := range []store.Owner{{ContainerID: "../x", IfName: "eth0"}, {ContainerID: "a", IfName: "x/y"}, {ContainerID: "a", IfName: "eth0\r\nb"}, {IfName: "eth0"}} {
		if _, err := d.Claim(ctx, store.Claim{IP: netip.MustParseAddr("10.0.0.9"), Owner: o}); err == nil {
			t.Errorf("owner %q accepted", o)
		}
	}
}

// TestLockTimeout holds the lock from outside, sees Claim wait for it in the
// kernel (a blocked flock in /proc/locks), and then sees the timeout fire with
// ErrBusy naming the lock. No duration is asserted: the 60 s bound only
// guards against a hang.
func TestLockTimeout(t *testing.T) {
	root := t.TempDir()
	d := open(t, root)
	lockPath := filepath.Join(root, "net1", "lock")
	f := holdLock(t, lockPath)
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		_, err := d.Claim(ctx, store.Claim{IP: netip.MustParseAddr("10.0.0.2"), Owner: ownerA})
		done <- err
	}()
	err := waitClaim(t, done)
	if !errors.Is(err, store.ErrBusy) || !strings.Contains(err.Error(), lockPath) || !strings.Contains(err.Error(), "gave up after 300ms") {
		t.Fatalf("err = %v, want ErrBusy after 300ms naming %s", err, lockPath)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if !claim(t, d, "10.0.0.2", ownerA, 0) {
		t.Fatal("claim after the lock was freed failed")
	}
}

// TestLockHandedOver proves Claim waits for a held lock rather than failing:
// it is blocked in flock (seen in /proc/locks) and succeeds once the holder
// lets go.
func TestLockHandedOver(t *testing.T) {
	root := t.TempDir()
	d, err := New(Options{DataDir: root, Network: "net1", LockTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	f := holdLock(t, filepath.Join(root, "net1", "lock"))
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		_, err := d.Claim(ctx, store.Claim{IP: netip.MustParseAddr("10.0.0.2"), Owner: ownerA})
		done <- err
	}()
	waitForFlockWaiter(t, f, done)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := waitClaim(t, done); err != nil {
		t.Fatalf("Claim after the holder let go: %v", err)
	}
}

func holdLock(t *testing.T, lockPath string) *os.File {
	t.Helper()
	f, err := os.Open(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return f
}

// waitClaim returns the Claim's result; 60 s is a hang guard, not a timing.
func waitClaim(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Claim still waiting after 60s")
		return nil
	}
}

// waitForFlockWaiter polls /proc/locks until a blocked flock waits on f's
// inode (a line with "->"), i.e. the Claim really waits in the kernel.
func waitForFlockWaiter(t *testing.T, f *os.File, done <-chan error) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	ino := fmt.Sprintf(":%d ", st.Ino)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		locks, err := os.ReadFile("/proc/locks")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(locks)) {
			if strings.Contains(line, "->") && strings.Contains(line, "FLOCK") && strings.Contains(line, ino) {
				return
			}
		}
		select {
		case err := <-done:
			t.Fatalf("Claim returned before waiting for the lock: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flock waiter on the lock after 60s:\n%s", locks)
		}
	}
}

// TestForeignWriters changes the directory the way host-local does (behind
// Village's index) and checks the index notices.
func TestForeignWriters(t *testing.T) {
	root := t.TempDir()
	d := open(t, root)
	dir := filepath.Join(root, "net1")
	claim(t, d, "10.0.0.2", ownerA, 0)
	foreign := store.Owner{ContainerID: "hl", IfName: "eth0"}
	// host-local reserves .3 and .4 for "hl".
	for _, ip := range []string{"10.0.0.3", "10.0.0.4"} {
		if err := os.WriteFile(filepath.Join(dir, ip), []byte("hl\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if claim(t, d, "10.0.0.3", ownerA, 0) {
		t.Fatal("claimed an address host-local holds")
	}
	got, _ := d.ListByOwner(ctx, foreign)
	if fmt.Sprint(got) != "[10.0.0.3 10.0.0.4]" {
		t.Fatalf("foreign owner holds %v", got)
	}
	// host-local releases .3 and re-reserves it for someone else: same names.
	if err := os.WriteFile(filepath.Join(dir, "10.0.0.3"), []byte("hl2\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "10.0.0.4"))
	got, _ = d.ListByOwner(ctx, foreign)
	if fmt.Sprint(got) != "[]" {
		t.Fatalf("after host-local DEL foreign owner holds %v", got)
	}
	if ok, _ := d.Release(ctx, netip.MustParseAddr("10.0.0.3"), foreign); ok {
		t.Fatal("released an address owned by someone else")
	}
	// The index itself deleted or corrupted: rebuilt.
	for _, content := range []string{"", "{garbage"} {
		p := filepath.Join(dir, metaName, indexName)
		if content == "" {
			os.Remove(p)
		} else {
			os.WriteFile(p, []byte(content), 0o600)
		}
		got, _ = d.ListByOwner(ctx, ownerA)
		if fmt.Sprint(got) != "[10.0.0.2]" {
			t.Fatalf("after index loss owner holds %v", got)
		}
	}
}

func TestCorruptRecords(t *testing.T) {
	root := t.TempDir()
	d := open(t, root)
	dir := filepath.Join(root, "net1")
	bad := map[string]string{
		"10.0.0.2":  "",                         // truncated
		"10.0.0.3":  "ctr\r\neth0\r\nextra",     // too many lines
		"10.0.0.4":  "../etc\r\neth0",           // bad id
		"10.0.0.5":  strings.Repeat("x", 10000), // huge
		"10.0.0.6":  "ctr-legacy",               // old host-local: ID only
		"10.0.0.9":  strings.Repeat("\x00", 9),  // named after a power loss, its data never written
		"junk":      "ctr-a\r\neth0",            // not an address: ignored
		"10.0.0.7x": "ctr-a\r\neth0",            // not an address: ignored
	}
	for n, c := range bad {
		os.WriteFile(filepath.Join(dir, n), []byte(c), 0o600)
	}
	os.Symlink("/etc/passwd", filepath.Join(dir, "10.0.0.8"))
	os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("not an ip"), 0o600)
	for _, ip := range []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.8", "10.0.0.9"} {
		if claim(t, d, ip, ownerA, 0) {
			t.Errorf("%s with a corrupt record was handed out", ip)
		}
	}
	if last, err := d.LastReserved(ctx, 0); err != nil || last.IsValid() {
		t.Fatalf("garbage marker: %v %v", last, err)
	}
	// Legacy record: matched by container ID for any ifname.
	legacy := store.Owner{ContainerID: "ctr-legacy", IfName: "eth0"}
	if got, _ := d.ListByOwner(ctx, legacy); fmt.Sprint(got) != "[10.0.0.6]" {
		t.Fatalf("legacy lookup %v", got)
	}
	all, _ := d.List(ctx)
	if len(all) != 7 {
		t.Fatalf("List = %v", all)
	}
	// GC keeps the legacy record of a valid container, drops the corrupt ones.
	rel, err := d.GC(ctx, store.Valid([]store.Owner{legacy}))
	if err != nil || len(rel) != 6 {
		t.Fatalf("GC released %v, %v", rel, err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("GC followed a symlink")
	}
	if _, err := os.Stat(filepath.Join(dir, "junk")); err != nil {
		t.Fatal("GC removed a file that is not a reservation")
	}
	if ok, _ := d.Release(ctx, netip.MustParseAddr("10.0.0.6"), legacy); !ok {
		t.Fatal("legacy record not released by its container")
	}
}

// TestHotPathReads checks ADD reads no reservation file and DEL only the
// owner's, with 250 allocations in the directory.
func TestHotPathReads(t *testing.T) {
	d := open(t, t.TempDir())
	for i := range 250 {
		o := store.Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}
		ip := netip.AddrFrom4([4]byte{10, 0, byte(i / 200), byte(2 + i%200)})
		if ok, err := d.Claim(ctx, store.Claim{IP: ip, Owner: o}); !ok || err != nil {
			t.Fatal(ip, ok, err)
		}
	}
	d.reads = 0
	o := store.Owner{ContainerID: "new", IfName: "eth0"}
	unlock, err := d.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := d.ListByOwner(ctx, o); len(got) != 0 {
		t.Fatal(got)
	}
	if claim(t, d, "10.0.0.2", o, 0) || !claim(t, d, "10.0.9.9", o, 0) {
		t.Fatal("claims")
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if d.reads != 0 {
		t.Fatalf("ADD read %d reservation files", d.reads)
	}
	victim := store.Owner{ContainerID: "c123", IfName: "eth0"}
	ips, _ := d.ListByOwner(ctx, victim)
	if len(ips) != 1 {
		t.Fatal(ips)
	}
	if ok, err := d.Release(ctx, ips[0], victim); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if d.reads != 1 {
		t.Fatalf("DEL read %d reservation files, want 1", d.reads)
	}
	// A second Disk (another process) trusts the index too.
	d2 := open(t, filepath.Dir(d.Dir()))
	if got, _ := d2.ListByOwner(ctx, victim); len(got) != 0 || d2.reads != 0 {
		t.Fatalf("second store: %v, %d reads", got, d2.reads)
	}
}

func BenchmarkDelIn250(b *testing.B) {
	d, err := New(Options{DataDir: b.TempDir(), Network: "n"})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 250 {
		o := store.Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}
		d.Claim(ctx, store.Claim{IP: netip.AddrFrom4([4]byte{10, 0, byte(i / 200), byte(2 + i%200)}), Owner: o})
	}
	o := store.Owner{ContainerID: "bench", IfName: "eth0"}
	ip := netip.MustParseAddr("10.9.9.9")
	b.ResetTimer()
	for range b.N {
		d.Claim(ctx, store.Claim{IP: ip, Owner: o})
		d.Release(ctx, ip, o)
	}
}

// TestPreparedRecord: a record prepared before the lock becomes the claimed
// address's file (same content and mode as one written under the lock), is
// used once, survives a claim that finds its address taken, and leaves no
// file behind in the meta directory.
func TestPreparedRecord(t *testing.T) {
	root := t.TempDir()
	d := open(t, root)
	dir := filepath.Join(root, "net1")
	ownerB := store.Owner{ContainerID: "ctr-b", IfName: "eth0"}
	claim(t, d, "10.0.0.2", ownerB, 0)
	d.Prepare(ownerA)
	if claim(t, d, "10.0.0.2", ownerA, 0) {
		t.Fatal("claimed an address ownerB holds")
	}
	if !claim(t, d, "10.0.0.3", ownerA, 0) || !claim(t, d, "fd00::3", ownerA, 1) {
		t.Fatal("claims failed")
	}
	for _, name := range []string{"10.0.0.3", "fd00::3"} {
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if err != nil || string(b) != "ctr-a\r\neth0" {
			t.Errorf("%s = %q, %v", name, b, err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
			t.Errorf("%s: mode %v, %d links; want 0600 and one link", name, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Nlink)
		}
	}
	d.Prepare(ownerB) // never used: Close drops it
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, metaName))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != indexName {
			t.Errorf("left in the meta directory: %s", e.Name())
		}
	}
	d2 := open(t, root)
	if got, _ := d2.ListByOwner(ctx, ownerA); len(got) != 2 {
		t.Errorf("ownerA holds %v after reopening; want two addresses", got)
	}
}

// TestIndexEncoding: the index round-trips every kind of record, and
// anything malformed, or written at another stamp, is never trusted.
func TestIndexEncoding(t *testing.T) {
	in := map[string]entry{
		"10.0.0.2":        {Owner: store.Owner{ContainerID: "pod-a", IfName: "eth0"}},
		"10.0.0.3":        {Owner: store.Owner{ContainerID: "legacy"}},
		"10.0.0.4":        {Corrupt: true},
		"::ffff:10.0.0.5": {Owner: store.Owner{ContainerID: "b.c_d-e", IfName: "net1"}},
		"fd00::2":         {Owner: store.Owner{ContainerID: "pod-a", IfName: "eth0"}},
		"10.0.0.6":        {Owner: store.Owner{ContainerID: "x", IfName: "-"}},
	}
	b := encodeIndex("1:2.3:4.5", in)
	out, ok := decodeIndex(b, "1:2.3:4.5")
	if !ok || !maps.Equal(in, out) {
		t.Fatalf("round trip:\n%s\ngave %v, %v", b, out, ok)
	}
	if _, ok := decodeIndex(b, "1:2.3:4.6"); ok {
		t.Error("index of another stamp trusted")
	}
	if out, ok := decodeIndex(encodeIndex("s", nil), "s"); !ok || len(out) != 0 {
		t.Errorf("empty index: %v, %v", out, ok)
	}
	good := indexHeader + "\nstamp s\n"
	for _, bad := range []string{
		"", "{garbage", `{"version":1,"stamp":"s","records":{}}`,
		indexHeader + "\nstamp s",                             // no newline after the stamp
		good + "10.0.0.2\to\tpod\teth0",                       // torn last line
		good + "10.0.0.2\to\tpod\n",                           // missing field
		good + "10.0.0.2\tx\tpod\teth0\n",                     // unknown flag
		good + "10.0.0.2\to\t\teth0\n",                        // owner without ID
		good + "10.0.0.2\tc\tpod\t\n",                         // corrupt with an owner
		good + "10.0.0.2\to\tpod\teth0\textra\n",              // extra field
		good + "\to\tpod\teth0\n",                             // no name
		good + "10.0.0.2\to\tp\teth0\n10.0.0.2\to\tq\teth0\n", // listed twice
	} {
		// Sealed with a valid checksum, so that the defect itself is what
		// must be refused.
		if out, ok := decodeIndex(sealIndex([]byte(bad)), "s"); ok {
			t.Errorf("trusted %q: %v", bad, out)
		}
	}
	// Torn writes: the in-place rewrite of a shorter index over a longer
	// one cut before its truncation, a block of the old file among the
	// new, a lost checksum line.
	long := encodeIndex("s", in)
	short := encodeIndex("s", map[string]entry{"10.0.0.2": in["10.0.0.2"]})
	moved := maps.Clone(in)
	moved["10.0.0.2"] = entry{Owner: store.Owner{ContainerID: "pod-z", IfName: "eth0"}} // same length as pod-a
	other := encodeIndex("s", moved)
	sumAt := bytes.LastIndexByte(long[:len(long)-1], '\n') + 1
	for name, torn := range map[string][]byte{
		"not truncated":       append(slices.Clone(short), long[len(short):]...),
		"an old block inside": append(slices.Clone(other[:sumAt]), long[sumAt:]...),
		"no checksum":         long[:sumAt],
		"checksum cut":        long[:len(long)-3],
	} {
		if bytes.Equal(torn, long) {
			t.Fatalf("%s: the torn copy is the original", name)
		}
		if out, ok := decodeIndex(torn, "s"); ok {
			t.Errorf("%s: trusted %q: %v", name, torn, out)
		}
	}
}

// sealIndex appends the checksum line an index file ends with.
func sealIndex(b []byte) []byte { return append(slices.Clone(b), indexSum(b)...) }
