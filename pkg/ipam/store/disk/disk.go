// Package disk is village-ipam's node-local store. It keeps allocations in
// the reference host-local plugin's on-disk format and location, so a node
// can switch between host-local and village-ipam (or run both on one network
// directory) without an address being handed out twice:
//
//	<dataDir>/<network>/lock                flock taken around every operation
//	<dataDir>/<network>/<ip>                "<containerID>\r\n<ifname>", one file per address
//	<dataDir>/<network>/last_reserved_ip.N  round-robin marker of range set N
//
// Village adds <dataDir>/<network>/.village/ (0700) holding index, an
// owner index that spares ADD and DEL from reading every reservation file,
// and the temporary files reservations are built in. See index.go for why the
// index can be trusted and when it is rebuilt.
//
// A reservation file is written completely in a temporary file and then
// hard-linked to its final name: link(2) fails when the name exists, so a
// reservation can never overwrite another one, even one made by a process
// that ignores the lock, and a process killed at any moment leaves either no
// record or a complete one.
//
// Nothing is fsynced, as with host-local. The store is node-local and so are
// the pods it describes: a power loss or kernel crash that takes the page
// cache takes every pod of the node with it. What such a crash can leave is a
// record of a pod that no longer exists (kept, or brought back because its
// removal was lost), or a named record with no content (the link reached the
// journal, the data did not): the first is any dead pod's record, the second
// reads as corrupt, and GC releases both (the runtime's GC, or villaged's
// orphan view). A lost record frees the address of a pod that is gone.
// Fsyncing (two per claim, one per release, as earlier versions did) cost a
// measurable part of an ADD's own time (docs/performance.md) and changed
// none of these outcomes: a record
// kept by an fsync after a crash names a pod that is gone all the same.
package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/validate"
)

const (
	lockName        = "lock"
	lastPrefix      = "last_reserved_ip."
	metaName        = ".village"
	indexName       = "index"
	legacyIndexName = "index.json" // version 1, JSON; removed when found
	tmpPrefix       = "tmp-"
	lineBreak       = "\r\n"
	maxRecordBytes  = 4096
	// DefaultLockTimeout is how long an operation waits for the lock.
	DefaultLockTimeout = 30 * time.Second
)

// Options configure a Disk store.
type Options struct {
	// DataDir is the root holding one directory per network
	// (store.DefaultDataDir when empty).
	DataDir string
	// Network is the network name; it becomes a directory name and must be
	// a valid CNI network name.
	Network string
	// LockTimeout bounds the wait for the lock (DefaultLockTimeout when 0).
	LockTimeout time.Duration
}

// Disk is the store of one network. Its methods take the lock themselves
// unless the caller holds it through Lock; while it is held that way, only the
// goroutine that took it may use the Disk.
type Disk struct {
	dir, lockPath, metaDir string
	timeout                time.Duration

	mu       sync.Mutex // serialises users inside this process (flock does not)
	lockFile *os.File

	stateMu  sync.Mutex
	explicit bool // held through Lock
	idx      *index
	dirty    bool
	reads    int // reservation files read (tests check the hot path stays lean)

	prepMu   sync.Mutex
	prepared map[store.Owner]*os.File // unnamed records (see Prepare)
}

var _ store.Store = (*Disk)(nil)

// New opens (creating when needed, 0700) the directory of opts.Network.
func New(opts Options) (*Disk, error) {
	if err := validate.NetworkName(opts.Network); err != nil {
		return nil, err
	}
	root := opts.DataDir
	if root == "" {
		root = store.DefaultDataDir
	}
	d := &Disk{
		dir:     filepath.Join(filepath.Clean(root), opts.Network),
		timeout: opts.LockTimeout,
	}
	if d.timeout <= 0 {
		d.timeout = DefaultLockTimeout
	}
	d.lockPath = filepath.Join(d.dir, lockName)
	d.metaDir = filepath.Join(d.dir, metaName)
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the store directory of network %q: %w", opts.Network, err)
	}
	if err := os.Mkdir(d.metaDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating %s: %w", d.metaDir, err)
	}
	if fi, err := os.Lstat(d.metaDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%s must be a directory (not a symlink or file); remove it and retry", d.metaDir)
	}
	f, err := os.OpenFile(d.lockPath, os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the lock file %s: %w", d.lockPath, err)
	}
	d.lockFile = f
	return d, nil
}

// Dir is the network's directory, <dataDir>/<network>.
func (d *Disk) Dir() string { return d.dir }

// Close closes the lock file and drops unused prepared records.
func (d *Disk) Close() error {
	d.prepMu.Lock()
	for o, f := range d.prepared {
		f.Close()
		delete(d.prepared, o)
	}
	d.prepMu.Unlock()
	return d.lockFile.Close()
}

// Prepare writes the reservation record of o ahead of the lock, as an
// unnamed file (O_TMPFILE) in the meta directory, so the next Claim for o
// only has to link(2) it to its address: the section every parallel ADD
// waits for stays short, and the record is complete before its name exists.
// An unnamed file never needs cleaning up (a crash frees it). Best effort: on
// a filesystem without O_TMPFILE, or any error, nothing is prepared and Claim
// writes the record itself.
func (d *Disk) Prepare(o store.Owner) {
	if store.ValidateOwner(o) != nil {
		return
	}
	fd, err := unix.Open(d.metaDir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), d.metaDir)
	if _, err := f.Write([]byte(o.ContainerID + lineBreak + o.IfName)); err != nil {
		f.Close()
		return
	}
	d.prepMu.Lock()
	if d.prepared == nil {
		d.prepared = map[store.Owner]*os.File{}
	}
	if old := d.prepared[o]; old != nil {
		old.Close()
	}
	d.prepared[o] = f
	d.prepMu.Unlock()
}

// linkPrepared gives the prepared record of o the name path. It reports
// false (and keeps the record) when there is none or linking fails for a
// reason other than the name existing; err wraps fs.ErrExist when it does.
func (d *Disk) linkPrepared(o store.Owner, path string) (bool, error) {
	d.prepMu.Lock()
	defer d.prepMu.Unlock()
	f := d.prepared[o]
	if f == nil {
		return false, nil
	}
	err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	switch {
	case err == nil:
		// A record names one address: a second claim of o writes its own.
		f.Close()
		delete(d.prepared, o)
		return true, nil
	case errors.Is(err, fs.ErrExist):
		return false, &os.LinkError{Op: "link", Old: f.Name(), New: path, Err: err}
	default:
		f.Close()
		delete(d.prepared, o)
		return false, nil
	}
}

// Lock takes the in-process mutex and the flock on <dir>/lock, waiting at
// most the configured timeout, then brings the owner index up to date.
func (d *Disk) Lock(ctx context.Context) (func() error, error) {
	if err := d.lock(ctx); err != nil {
		return nil, err
	}
	d.stateMu.Lock()
	d.explicit = true
	d.stateMu.Unlock()
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			d.stateMu.Lock()
			d.explicit = false
			d.stateMu.Unlock()
			err = d.unlock()
		})
		return err
	}, nil
}

func (d *Disk) lock(ctx context.Context) error {
	d.mu.Lock()
	if err := d.flock(ctx); err != nil {
		d.mu.Unlock()
		return err
	}
	if err := d.sync(); err != nil {
		_ = syscall.Flock(int(d.lockFile.Fd()), syscall.LOCK_UN)
		d.mu.Unlock()
		return err
	}
	return nil
}

func (d *Disk) flock(ctx context.Context) error {
	err := syscall.Flock(int(d.lockFile.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		return nil
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
		return fmt.Errorf("locking %s: %w", d.lockPath, err)
	}
	return d.waitLock(ctx)
}

// waitLock waits for the lock in flock(2) itself, so the kernel hands it
// over the moment the holder lets go (as host-local's waiters get it). A
// sleep-and-retry loop overshoots: with parallel ADDs most waiters slept
// while the lock was free, which made a burst of ADDs wait longer than it
// worked. The wait uses a descriptor of its own, which becomes the store's
// when it gets the lock; when the timeout or ctx ends first, the waiter is
// abandoned and closes that descriptor (releasing the lock, should it get it
// later) without touching the store's.
func (d *Disk) waitLock(ctx context.Context) error {
	f, err := os.OpenFile(d.lockPath, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("locking %s: %w", d.lockPath, err)
	}
	fd := int(f.Fd())
	got := make(chan error, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		var err error
		for {
			if err = syscall.Flock(fd, syscall.LOCK_EX); !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			f.Close()
			return
		}
		got <- err
	}()
	timer := time.NewTimer(d.timeout)
	defer timer.Stop()
	var werr error
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return fmt.Errorf("locking %s: %w", d.lockPath, err)
		}
		d.lockFile.Close()
		d.lockFile = f
		return nil
	case <-timer.C:
		werr = fmt.Errorf("gave up after %s waiting for the lock %s, held by another village-ipam or host-local process; retry later (a process stuck holding it shows up in `fuser %s`): %w",
			d.timeout, d.lockPath, d.lockPath, store.ErrBusy)
	case <-ctx.Done():
		werr = fmt.Errorf("waiting for the lock %s: %w", d.lockPath, ctx.Err())
	}
	mu.Lock()
	abandoned = true
	select {
	case <-got: // taken just now: let go of it
		f.Close()
	default:
	}
	mu.Unlock()
	return werr
}

// unlock writes the index back and releases the lock.
func (d *Disk) unlock() error {
	var err error
	if d.dirty {
		if err = d.writeIndex(); err == nil {
			d.dirty = false
		}
	}
	d.idx = nil
	if uerr := syscall.Flock(int(d.lockFile.Fd()), syscall.LOCK_UN); uerr != nil && err == nil {
		err = fmt.Errorf("unlocking %s: %w", d.lockPath, uerr)
	}
	d.mu.Unlock()
	return err
}

// do runs fn with the lock held: the caller's, or one taken for fn alone.
func (d *Disk) do(ctx context.Context, fn func() error) error {
	d.stateMu.Lock()
	explicit := d.explicit
	d.stateMu.Unlock()
	if explicit {
		return fn()
	}
	if err := d.lock(ctx); err != nil {
		return err
	}
	err := fn()
	if uerr := d.unlock(); uerr != nil && err == nil {
		err = uerr
	}
	return err
}

// Claim implements store.Store.
func (d *Disk) Claim(ctx context.Context, c store.Claim) (bool, error) {
	if err := store.ValidateOwner(c.Owner); err != nil {
		return false, err
	}
	if !c.IP.IsValid() || c.RangeSet < 0 {
		return false, fmt.Errorf("invalid claim of %v in range set %d", c.IP, c.RangeSet)
	}
	ip := c.IP.Unmap()
	var ok bool
	err := d.do(ctx, func() error {
		if _, taken := d.idx.byIP[ip]; taken {
			return nil
		}
		name := ip.String()
		linked, err := d.linkPrepared(c.Owner, filepath.Join(d.dir, name))
		if !linked && err == nil {
			tmp, werr := d.writeTemp([]byte(c.Owner.ContainerID + lineBreak + c.Owner.IfName))
			if werr != nil {
				return fmt.Errorf("writing the reservation of %s: %w", ip, werr)
			}
			defer os.Remove(tmp)
			err = os.Link(tmp, filepath.Join(d.dir, name))
		}
		if err != nil {
			if errors.Is(err, fs.ErrExist) {
				// Written behind the lock's back: learn its owner, refuse.
				d.idx.add(name, d.readRecord(name))
				d.dirty = true
				return nil
			}
			return fmt.Errorf("reserving %s in %s: %w", ip, d.dir, err)
		}
		if err := d.writeLast(c.RangeSet, name); err != nil {
			// Take it back so the failed claim leaves nothing.
			_ = os.Remove(filepath.Join(d.dir, name))
			return err
		}
		d.dirty = true
		d.idx.add(name, entry{Owner: c.Owner})
		ok = true
		return nil
	})
	return ok, err
}

// Release implements store.Store; a record written with only the container
// ID (old host-local) matches any interface name of that container.
func (d *Disk) Release(ctx context.Context, ip netip.Addr, o store.Owner) (bool, error) {
	ip = ip.Unmap()
	var ok bool
	err := d.do(ctx, func() error {
		e, found := d.idx.byIP[ip]
		if !found {
			return nil
		}
		// The index is current, but the file is the truth: check it.
		cur := d.readRecord(e.Name)
		if !cur.matches(o) {
			return nil
		}
		if err := os.Remove(filepath.Join(d.dir, e.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("releasing %s of %v: %w", ip, o, err)
		}
		d.idx.remove(e.Name)
		d.dirty = true
		ok = true
		return nil
	})
	return ok, err
}

// ListByOwner implements store.Store from the index (no reservation file is
// read). Records holding only the container ID count when the owner has no
// exact record, as host-local's release does.
func (d *Disk) ListByOwner(ctx context.Context, o store.Owner) ([]netip.Addr, error) {
	var out []netip.Addr
	err := d.do(ctx, func() error {
		out = d.idx.byOwner(o)
		return nil
	})
	return out, err
}

// List implements store.Store. Unreadable or corrupt records are listed with
// an empty Owner: their addresses stay taken.
func (d *Disk) List(ctx context.Context) ([]store.Allocation, error) {
	var out []store.Allocation
	err := d.do(ctx, func() error {
		for ip, e := range d.idx.byIP {
			out = append(out, store.Allocation{IP: ip, Owner: e.Owner})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b store.Allocation) int { return a.IP.Compare(b.IP) })
	return out, err
}

// LastReserved implements store.Store; a missing or unreadable marker means
// none (round-robin then starts at the beginning, as host-local does).
func (d *Disk) LastReserved(ctx context.Context, rangeSet int) (netip.Addr, error) {
	var out netip.Addr
	err := d.do(ctx, func() error {
		b, err := readLimited(filepath.Join(d.dir, lastPrefix+strconv.Itoa(rangeSet)))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("reading the round-robin marker of range set %d: %w", rangeSet, err)
		}
		if a, perr := netip.ParseAddr(strings.TrimSpace(string(b))); perr == nil && a.Zone() == "" {
			out = a.Unmap()
		}
		return nil
	})
	return out, err
}

// GC implements store.Store. Corrupt records belong to no attachment and are
// released too.
func (d *Disk) GC(ctx context.Context, keep func(store.Owner) bool) ([]store.Allocation, error) {
	var released []store.Allocation
	var errs []error
	err := d.do(ctx, func() error {
		for ip, e := range d.idx.byIP {
			if !e.Corrupt && keep(e.Owner) {
				continue
			}
			if err := os.Remove(filepath.Join(d.dir, e.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("releasing stale %s: %w", ip, err))
				continue
			}
			d.idx.remove(e.Name)
			d.dirty = true
			released = append(released, store.Allocation{IP: ip, Owner: e.Owner})
		}
		return nil
	})
	slices.SortFunc(released, func(a, b store.Allocation) int { return a.IP.Compare(b.IP) })
	return released, errors.Join(append(errs, err)...)
}

// readRecord reads the reservation file name; a file that cannot be read or
// parsed yields a corrupt entry (the address stays taken).
func (d *Disk) readRecord(name string) entry {
	d.reads++
	path := filepath.Join(d.dir, name)
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return entry{Name: name, Corrupt: true}
	}
	b, err := readLimited(path)
	if err != nil {
		return entry{Name: name, Corrupt: true}
	}
	o, ok := parseRecord(b)
	return entry{Name: name, Owner: o, Corrupt: !ok}
}

// parseRecord parses "<containerID>\r\n<ifname>" (surrounding whitespace
// ignored), or a bare container ID as very old host-local wrote.
func parseRecord(b []byte) (store.Owner, bool) {
	id, ifname, two := strings.Cut(strings.TrimSpace(string(b)), lineBreak)
	o := store.Owner{ContainerID: id, IfName: ifname}
	if validate.ContainerID(id) != nil || (two && validate.LinkName(ifname) != nil) {
		return store.Owner{}, false
	}
	return o, true
}

func readLimited(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecordBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRecordBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxRecordBytes)
	}
	return b, nil
}

// writeTemp writes b to a new 0600 file in the meta directory.
func (d *Disk) writeTemp(b []byte) (string, error) {
	f, err := os.CreateTemp(d.metaDir, tmpPrefix)
	if err != nil {
		return "", err
	}
	name := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

// writeLast rewrites last_reserved_ip.<set> in place, as host-local does.
// It is only a round-robin hint, read under the same lock, so it needs no
// fsync and no temporary file and rename (on ext4 a rename over an existing
// file also starts writeback of the new one, inside the lock). A marker torn
// by a crash reads as none (LastReserved), which only restarts the
// round-robin. Whatever is in the way (a symlink, a directory) is replaced.
func (d *Disk) writeLast(set int, name string) error {
	path := filepath.Join(d.dir, lastPrefix+strconv.Itoa(set))
	if err := writeInPlace(path, []byte(name)); err != nil {
		return fmt.Errorf("writing the round-robin marker %s: %w", path, err)
	}
	return nil
}

// writeInPlace makes b the content of path without a temporary file: pwrite
// over whatever is there, then truncate. Whatever is in the way of a regular
// file (a symlink, a directory) is replaced. Only for files that read a torn
// write as stale (the index's checksum, the marker's address syntax).
func writeInPlace(path string, b []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		_ = os.RemoveAll(path)
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	}
	if err != nil {
		return err
	}
	_, err = unix.Pwrite(fd, b, 0)
	if err == nil {
		err = unix.Ftruncate(fd, int64(len(b)))
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

// Probe checks the network directory can be written (a read-only or full
// filesystem makes every ADD fail) by writing and removing a temporary file.
func (d *Disk) Probe(ctx context.Context) error {
	tmp, err := d.writeTemp([]byte("probe"))
	if err != nil {
		return fmt.Errorf("store directory %s cannot be written: %w", d.dir, err)
	}
	return os.Remove(tmp)
}
