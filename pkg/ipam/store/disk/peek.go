package disk

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/village-cni/village/pkg/ipam/store"
)

// Reservation is one address of a network's directory as Peek reads it.
type Reservation struct {
	IP netip.Addr
	// Owner is the record's attachment (zero unless Peek read owners); an
	// empty IfName is a record from a very old host-local.
	Owner store.Owner
	// Corrupt: the record could not be read or parsed (or was released
	// while Peek looked).
	Corrupt bool
}

// Peek lists the reservations of network under dataDir ("" means
// store.DefaultDataDir) for read-only views such as villaged's orphan
// report and allocation metrics: it takes no lock and creates nothing, so
// it never slows an ADD and may see an operation half done. With owners
// false it only lists the directory (no record is opened). A network
// without a directory has no reservations.
func Peek(dataDir, network string, owners bool) ([]Reservation, error) {
	if dataDir == "" {
		dataDir = store.DefaultDataDir
	}
	dir := filepath.Join(dataDir, network)
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the allocations in %s: %w", dir, err)
	}
	d := &Disk{dir: dir}
	var out []Reservation
	for _, e := range entries {
		ip, ok := recordIP(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		r := Reservation{IP: ip}
		if owners {
			rec := d.readRecord(e.Name())
			r.Owner, r.Corrupt = rec.Owner, rec.Corrupt
		}
		out = append(out, r)
	}
	return out, nil
}
