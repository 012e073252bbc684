package landhcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/nodelocal"
)

// DefaultDir is where the leases are kept across agent restarts.
const DefaultDir = nodelocal.DHCPLeaseDir

// record is a lease as written to disk: who asked, and the server's
// offer and latest ACK as sent (so a restarted agent renews exactly what
// the server granted).
type record struct {
	agentsock.Attachment
	Network  string    `json:"network"`
	Netns    string    `json:"netns"`
	MAC      string    `json:"mac"`
	ClientID []byte    `json:"clientID"`
	Hostname string    `json:"hostname,omitempty"`
	Offer    []byte    `json:"offer"`
	ACK      []byte    `json:"ack"`
	Granted  time.Time `json:"granted"` // when the ACK came: the lease's times count from here
}

func (r *record) lease() (*nclient4.Lease, error) {
	offer, err := dhcpv4.FromBytes(r.Offer)
	if err != nil {
		return nil, fmt.Errorf("offer: %w", err)
	}
	ack, err := dhcpv4.FromBytes(r.ACK)
	if err != nil {
		return nil, fmt.Errorf("ACK: %w", err)
	}
	return &nclient4.Lease{Offer: offer, ACK: ack, CreationTime: r.Granted}, nil
}

func fileName(a agentsock.Attachment) string { return a.ContainerID + "_" + a.IfName + ".json" }

// save writes r atomically (a crash leaves the old record or the new one).
func save(dir string, r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lease directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, fileName(r.Attachment))
	if err := nodelocal.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	return nil
}

func remove(dir string, a agentsock.Attachment) error {
	err := os.Remove(filepath.Join(dir, fileName(a)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing lease of %s/%s: %w", a.ContainerID, a.IfName, err)
	}
	return nil
}

// loadAll reads every record in dir; a file that cannot be read is
// reported in bad and left for the admin.
func loadAll(dir string) (recs []*record, bad []error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, []error{fmt.Errorf("lease directory %s: %w", dir, err)}
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		r := &record{}
		if err := json.Unmarshal(b, r); err != nil {
			bad = append(bad, fmt.Errorf("lease %s: %w", path, err))
			continue
		}
		if _, err := r.lease(); err != nil {
			bad = append(bad, fmt.Errorf("lease %s: %w", path, err))
			continue
		}
		recs = append(recs, r)
	}
	return recs, bad
}
