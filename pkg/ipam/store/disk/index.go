package disk

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/village-cni/village/pkg/ipam/store"
)

// The owner index.
//
// host-local finds a container's addresses by reading every file of the
// network directory, on every ADD and DEL. Village keeps .village/index
// instead: the owner of every reservation file plus a stamp of the network
// directory (inode, mtime, ctime) taken, under the lock, right after
// Village's own last change. On each Lock the index is trusted only when
//
//   - the directory's stamp is unchanged, and
//   - the names of the reservation files in the directory (one getdents,
//     no file is opened) are exactly the index's keys.
//
// Any writer that is not Village (host-local on the same directory, a
// person) creates, removes or renames entries, which changes the
// directory's mtime/ctime; the name comparison also catches changes made
// within one timestamp tick of Village's last write. When either check fails
// the index is rebuilt by reading every record once, and written back at
// unlock. So a DEL costs one directory listing, reading the container's one or
// two record files, one unlink and one index rewrite, whatever the number of
// allocations; an ADD reads no reservation file at all.
//
// The index is read and rewritten under the lock by every ADD and DEL, so
// its encoding is plain text that needs no reflection: a header line, the
// stamp, one tab-separated line per record and a checksum
//
//	village-ipam index 4
//	stamp <ino>:<mtime>:<ctime>
//	<file name>\t<o|c>\t<containerID>\t<ifname>
//	sum <FNV-1a 64 of every byte before this line, 16 hex digits>
//
// ("o" a parsed owner, "c" a corrupt record; none of the fields can hold a
// tab or a newline: names are IP addresses, IDs and interface names are
// validated). At 250 records, loading and writing it back costs about a
// tenth of what the JSON encoding of version 1 (index.json, removed when
// found) did, which made ADD latency grow with the number of pods on a node.
// Anything unexpected in the file makes the index stale, never trusted.
//
// The index is a cache that checks itself, so it is rewritten in place and
// not fsynced: a write torn by a crash (new bytes over a longer old file, or
// a mix of old and new blocks after a power loss) fails the checksum and
// reads as stale, like any other damage. In place, because the temporary
// file and rename(2) it replaced made ext4 start the new file's writeback
// inside the lock (replace-on-rename), which every parallel ADD waited for.
// Claims never rely on the index for exclusivity (link(2) does that).

const indexHeader = "village-ipam index 4"

// indexSum is the checksum line of an index's content (see above): 64-bit
// FNV-1a, which needs no table. Version 3 used CRC-32C, whose tables Go
// builds at package init on every exec of village-ipam; CRC-32 (IEEE) still
// builds one (docs/performance.md, "Figures behind code comments"). Any
// 64-bit hash tells a torn or stale write from the bytes it was computed
// over; nothing here guards against a deliberate forgery.
func indexSum(b []byte) string {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return fmt.Sprintf("sum %016x\n", h.Sum64())
}

type entry struct {
	Name    string
	Owner   store.Owner
	Corrupt bool
}

type index struct {
	byName map[string]entry
	byIP   map[netip.Addr]entry
}

func newIndex() *index {
	return &index{byName: map[string]entry{}, byIP: map[netip.Addr]entry{}}
}

func (x *index) add(name string, e entry) {
	ip, ok := recordIP(name)
	if !ok {
		return
	}
	e.Name = name
	x.byName[name] = e
	x.byIP[ip] = e
}

func (x *index) remove(name string) {
	if ip, ok := recordIP(name); ok {
		delete(x.byIP, ip)
	}
	delete(x.byName, name)
}

func (x *index) byOwner(o store.Owner) []netip.Addr {
	var exact, legacy []netip.Addr
	for ip, e := range x.byIP {
		switch {
		case e.Corrupt:
		case e.Owner == o:
			exact = append(exact, ip)
		case e.Owner.IfName == "" && e.Owner.ContainerID == o.ContainerID:
			legacy = append(legacy, ip)
		}
	}
	if len(exact) == 0 {
		exact = legacy
	}
	slices.SortFunc(exact, netip.Addr.Compare)
	return exact
}

// matches reports whether a record may be released by o.
func (e entry) matches(o store.Owner) bool {
	if e.Corrupt {
		return false
	}
	return e.Owner == o || (e.Owner.IfName == "" && e.Owner.ContainerID == o.ContainerID)
}

// recordIP reports whether a directory entry name is a reservation, i.e. an
// IP address. Non-canonical spellings count too (they still hold the
// address); the lock, the markers and the meta directory do not parse.
func recordIP(name string) (netip.Addr, bool) {
	if strings.HasPrefix(name, lastPrefix) || name == lockName || name == metaName {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(name)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func (d *Disk) stamp() (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(d.dir, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", d.dir, err)
	}
	return fmt.Sprintf("%d:%d.%d:%d.%d", st.Ino, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec), nil
}

// sync loads the index, checks it against the directory and rebuilds it when
// stale. Called with the lock held.
func (d *Disk) sync() error {
	d.cleanTemp()
	stamp, err := d.stamp()
	if err != nil {
		return err
	}
	f, err := os.Open(d.dir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", d.dir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("listing %s: %w", d.dir, err)
	}
	var records []string
	for _, n := range names {
		if _, ok := recordIP(n); ok {
			records = append(records, n)
		}
	}
	if x := d.loadIndex(stamp, records); x != nil {
		d.idx, d.dirty = x, false
		return nil
	}
	x := newIndex()
	for _, n := range records {
		x.add(n, d.readRecord(n))
	}
	d.idx, d.dirty = x, true
	return nil
}

// loadIndex returns the stored index when it is current, else nil.
func (d *Disk) loadIndex(stamp string, records []string) *index {
	b, err := os.ReadFile(filepath.Join(d.metaDir, indexName))
	if err != nil {
		return nil
	}
	stored, ok := decodeIndex(b, stamp)
	if !ok || len(stored) != len(records) {
		return nil
	}
	x := newIndex()
	for _, n := range records {
		e, ok := stored[n]
		if !ok {
			return nil
		}
		x.add(n, e)
	}
	return x
}

// decodeIndex parses an index file written at stamp; ok is false for any
// other stamp or anything malformed.
func decodeIndex(b []byte, stamp string) (map[string]entry, bool) {
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return nil, false
	}
	last := bytes.LastIndexByte(b[:len(b)-1], '\n') + 1
	if string(b[last:]) != indexSum(b[:last]) {
		return nil, false
	}
	text := string(b[:last])
	header, text, ok1 := strings.Cut(text, "\n")
	stampLine, text, ok2 := strings.Cut(text, "\n")
	if !ok1 || !ok2 || header != indexHeader || stampLine != "stamp "+stamp || (text != "" && !strings.HasSuffix(text, "\n")) {
		return nil, false
	}
	out := make(map[string]entry, strings.Count(text, "\n"))
	for text != "" {
		var line string
		line, text, _ = strings.Cut(text, "\n")
		name, rest, ok1 := strings.Cut(line, "\t")
		flag, rest, ok2 := strings.Cut(rest, "\t")
		id, ifname, ok3 := strings.Cut(rest, "\t")
		if !ok1 || !ok2 || !ok3 || name == "" || strings.Contains(ifname, "\t") {
			return nil, false
		}
		if _, dup := out[name]; dup {
			return nil, false
		}
		switch {
		case flag == "c" && id == "" && ifname == "":
			out[name] = entry{Corrupt: true}
		case flag == "o" && id != "":
			out[name] = entry{Owner: store.Owner{ContainerID: id, IfName: ifname}}
		default:
			return nil, false
		}
	}
	return out, true
}

// encodeIndex is the inverse of decodeIndex.
func encodeIndex(stamp string, byName map[string]entry) []byte {
	size := len(indexHeader) + len(stamp) + 8 + len("sum 00000000\n")
	for n, e := range byName {
		size += len(n) + len(e.Owner.ContainerID) + len(e.Owner.IfName) + 5
	}
	b := make([]byte, 0, size)
	b = append(b, indexHeader+"\nstamp "...)
	b = append(b, stamp...)
	b = append(b, '\n')
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		e := byName[n]
		b = append(b, n...)
		if e.Corrupt {
			b = append(b, "\tc\t\t\n"...)
			continue
		}
		b = append(b, "\to\t"...)
		b = append(b, e.Owner.ContainerID...)
		b = append(b, '\t')
		b = append(b, e.Owner.IfName...)
		b = append(b, '\n')
	}
	return append(b, indexSum(b)...)
}

// writeIndex rewrites the index in place (see the checksum above).
func (d *Disk) writeIndex() error {
	stamp, err := d.stamp()
	if err != nil {
		return err
	}
	b := encodeIndex(stamp, d.idx.byName)
	if err := writeInPlace(filepath.Join(d.metaDir, indexName), b); err != nil {
		return fmt.Errorf("writing the index of %s: %w", d.dir, err)
	}
	return nil
}

// cleanTemp removes temporary files a crashed process left behind (they only
// exist while the lock is held). Their content looks like a record, and
// host-local, which walks subdirectories, must not mistake them for one.
// The version 1 index (index.json) goes too: nothing reads it any more.
func (d *Disk) cleanTemp() {
	entries, _ := os.ReadDir(d.metaDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) || e.Name() == legacyIndexName {
			_ = os.Remove(filepath.Join(d.metaDir, e.Name()))
		}
	}
}
