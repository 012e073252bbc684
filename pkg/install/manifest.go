package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ManifestName is the file under the state directory that records what
// install put on the node.
const ManifestName = "install.json"

// Manifest records what install added, so uninstall removes exactly that.
type Manifest struct {
	// Version of the villaged that wrote it.
	Version string `json:"version"`
	// Files are the binaries and the conflist install wrote.
	Files []FileRecord `json:"files"`
	// Networks are the networks of the installed conflist, with the node
	// objects Village makes for them (for uninstall --purge-network).
	Networks []NetworkRecord `json:"networks,omitempty"`
}

// FileRecord is one file install wrote.
type FileRecord struct {
	Path string `json:"path"`
	Kind string `json:"kind"` // "binary" or "conflist"
	// SHA256 is the content install wrote; uninstall leaves a file alone
	// when it no longer matches (someone else replaced it since).
	SHA256 string `json:"sha256"`
	// Backup holds the file that was at Path before the first install (a
	// reference loopback plugin, a hand-written conflist); uninstall puts it
	// back.
	Backup string `json:"backup,omitempty"`
}

// NetworkRecord names the node objects of one installed network.
type NetworkRecord struct {
	Name    string   `json:"name"`
	Bridges []string `json:"bridges,omitempty"`
	VXLAN   []string `json:"vxlan,omitempty"`
	Shims   []string `json:"shims,omitempty"`
}

// LoadManifest reads the manifest in stateDir; a missing one is an empty
// manifest and ok.
func LoadManifest(stateDir string) (*Manifest, error) {
	path := filepath.Join(stateDir, ManifestName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Manifest{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read install manifest %s: %w", path, err)
	}
	m := &Manifest{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("parse install manifest %s: %w", path, err)
	}
	return m, nil
}

func (m *Manifest) save(stateDir string) error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("create state directory %s: %w", stateDir, err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(stateDir, ManifestName), append(b, '\n'), 0o644)
}

func (m *Manifest) record(path string) *FileRecord {
	for i := range m.Files {
		if m.Files[i].Path == path {
			return &m.Files[i]
		}
	}
	return nil
}

func (m *Manifest) drop(path string) {
	for i := range m.Files {
		if m.Files[i].Path == path {
			m.Files = append(m.Files[:i], m.Files[i+1:]...)
			return
		}
	}
}
