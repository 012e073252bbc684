package install

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/village-cni/village/pkg/nodelocal"
)

// UninstallOptions say what to take off the node.
type UninstallOptions struct {
	StateDir string // where install kept its manifest; DefaultStateDir when empty
	// PurgeNetwork also removes the node objects Village made for the
	// installed networks (see Purge), in the caller's network namespace.
	PurgeNetwork bool
	// RunDir is the agent's run directory, whose host-side credentials
	// go (nodelocal.HostCredsDir); "" is nodelocal.RunDir().
	RunDir string
}

// Uninstall removes exactly what the manifest lists: the conflist first (so
// runtimes stop using the network), then the binaries. A file that changed
// since install is left in place and reported; a replaced file comes back
// from its backup. The host-side credentials the agent keeps under the run
// directory go too. With PurgeNetwork, Purge runs for the recorded networks.
func Uninstall(o UninstallOptions) (*Report, error) {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	m, err := LoadManifest(o.StateDir)
	if err != nil {
		return nil, err
	}
	r := &Report{}
	if len(m.Files) == 0 && len(m.Networks) == 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("no install manifest in %s: nothing recorded to remove", o.StateDir))
	}
	recs := slices.Clone(m.Files)
	slices.SortStableFunc(recs, func(a, b FileRecord) int {
		return rank(a.Kind) - rank(b.Kind)
	})
	for _, rec := range recs {
		if err := removeRecord(r, rec); err != nil {
			return r, err
		}
		m.drop(rec.Path)
		if err := m.save(o.StateDir); err != nil {
			return r, err
		}
	}
	// The LAN pool's host token and kubeconfig: the agent removes them on
	// SIGTERM, but one killed (or a node uninstalled without its agent
	// stopped first) leaves a live token on the host.
	if err := removeHostCreds(r, o.RunDir); err != nil {
		return r, err
	}
	if o.PurgeNetwork {
		changes, err := Purge(m.Networks)
		r.Changes = append(r.Changes, changes...)
		if err != nil {
			return r, err
		}
	}
	manifest := filepath.Join(o.StateDir, ManifestName)
	if err := removeDurably(manifest); err != nil {
		return r, err
	}
	// Only empty directories go: a kept file's backup stays with it.
	_ = os.Remove(filepath.Join(o.StateDir, "backup"))
	return r, nil
}

func rank(kind string) int {
	if kind == "conflist" {
		return 0
	}
	return 1
}

// removeRecord takes one recorded file off the node (or puts its backup
// back), unless it changed since install.
func removeRecord(r *Report, rec FileRecord) error {
	have, _, exists, err := fileDigest(rec.Path)
	if err != nil {
		return err
	}
	if exists && rec.SHA256 != "" && have != rec.SHA256 {
		note := "changed since install; left in place"
		if rec.Backup != "" {
			note += ", the file it replaced is still in " + rec.Backup
		}
		r.add(Kept, rec.Path, note)
		return nil
	}
	if rec.Backup != "" {
		data, err := os.ReadFile(rec.Backup)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			r.Warnings = append(r.Warnings, fmt.Sprintf("backup %s of %s is gone; cannot put the original back", rec.Backup, rec.Path))
		case err != nil:
			return fmt.Errorf("read backup %s: %w", rec.Backup, err)
		default:
			fi, err := os.Stat(rec.Backup)
			if err != nil {
				return fmt.Errorf("stat backup %s: %w", rec.Backup, err)
			}
			if err := writeAtomic(rec.Path, data, fi.Mode().Perm()); err != nil {
				return err
			}
			r.add(Restored, rec.Path, "from "+rec.Backup)
			return removeDurably(rec.Backup)
		}
	}
	if !exists {
		r.add(Absent, rec.Path, "")
		return nil
	}
	if err := removeDurably(rec.Path); err != nil {
		return err
	}
	r.add(Removed, rec.Path, "")
	return nil
}

// removeHostCreds removes the host-side Kubernetes credentials of a LAN pool
// (<run dir>/kube/: token, ca.crt, kubeconfig) and reports it.
func removeHostCreds(r *Report, runDir string) error {
	dir := nodelocal.HostCredsDir(runDir)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		r.add(Absent, dir, "host credentials of the LAN pool")
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the host credentials %s: %w", dir, err)
	}
	if err := nodelocal.SyncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	r.add(Removed, dir, "host credentials of the LAN pool")
	return nil
}
