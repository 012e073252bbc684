// Package install puts Village on a node and takes it off again: the plugin
// binaries into the CNI binary directory and the conflist (rendered from a
// template with the node's values) into the CNI config directory, every file
// written atomically (temporary file in the target directory, fsync, rename)
// so a runtime never execs a half-written binary or loads half a conflist.
//
// Install records what it wrote in a manifest (<state-dir>/install.json),
// with a backup of any file it replaced (a reference loopback plugin, a
// hand-written conflist of the same name). Uninstall removes exactly what the
// manifest lists, puts the backups back, leaves alone any file changed since,
// and, when asked, removes the node objects Village made for the installed
// networks (see Purge). Both are idempotent: a second run changes nothing and
// says so.
package install

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
)

// Defaults for Options.
const (
	DefaultBinDir   = "/opt/cni/bin"
	DefaultConfDir  = "/etc/cni/net.d"
	DefaultStateDir = "/var/lib/village"
	DefaultConfName = "10-village.conflist"
)

// Plugins are the binaries install copies by default.
var Plugins = []string{"village", "village-ipam", "village-ipam-etcd", "village-ipam-kube", "loopback"}

// Companions are reference plugins the shipped conflists chain (portmap, for
// hostPort; bandwidth, for the kubernetes.io/ingress-bandwidth and
// egress-bandwidth annotations). Install copies one from BinSource when it
// is there, and only into a binary directory that has none or has the copy
// an earlier install placed: a portmap or bandwidth that came with the node
// (its distribution's CNI plugins) is the node's and stays as it is.
var Companions = []string{"portmap", "bandwidth"}

// Options say where to install from and to.
type Options struct {
	BinDir  string // CNI binary directory; DefaultBinDir when empty
	ConfDir string // CNI config directory; DefaultConfDir when empty
	// StageDir, when set, receives the conflist instead of ConfDir: the
	// agent (`villaged run --publish-conf-dir`) moves it into ConfDir once it
	// holds the node's pod subnet, so the runtime does not report the
	// network ready before Village can address a pod. A conflist an earlier
	// install (or the agent) left in ConfDir stays.
	StageDir string
	StateDir string // where the manifest and backups live; DefaultStateDir when empty
	// BinSource is the directory holding the binaries to install.
	BinSource string
	// Binaries to install from BinSource; Plugins when empty.
	Binaries []string
	// Companions to install from BinSource when the node lacks them;
	// Companions when nil.
	Companions []string
	// Template is the conflist template; DefaultTemplate when nil.
	// TemplateName names it in errors.
	Template     []byte
	TemplateName string
	// ConfName is the conflist's file name; DefaultConfName when empty.
	ConfName string
	// Vars override everything else when rendering the template.
	Vars map[string]string
	// LookupEnv is consulted after Vars and before the detected NodeVars;
	// os.LookupEnv when nil.
	LookupEnv func(string) (string, bool)
	// NodeVars are the detected values; NodeVars() when nil.
	NodeVars map[string]string
}

func (o *Options) defaults() {
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir
	}
	if o.ConfDir == "" {
		o.ConfDir = DefaultConfDir
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if len(o.Binaries) == 0 {
		o.Binaries = Plugins
	}
	if o.Companions == nil {
		o.Companions = Companions
	}
	if o.Template == nil {
		o.Template, o.TemplateName = DefaultTemplate, "built-in template"
	}
	if o.TemplateName == "" {
		o.TemplateName = "template"
	}
	if o.ConfName == "" {
		o.ConfName = DefaultConfName
	}
	if o.LookupEnv == nil {
		o.LookupEnv = os.LookupEnv
	}
	if o.NodeVars == nil {
		o.NodeVars = NodeVars()
	}
}

func (o *Options) lookup(name string) (string, bool) {
	if v, ok := o.Vars[name]; ok {
		return v, true
	}
	if v, ok := o.LookupEnv(name); ok {
		return v, true
	}
	switch name {
	case "CNI_BIN_DIR":
		return o.BinDir, true
	case "CNI_CONF_DIR":
		return o.ConfDir, true
	}
	v, ok := o.NodeVars[name]
	return v, ok
}

// Action is what happened to one file or node object.
type Action string

// The actions a Report lists.
const (
	Created   Action = "created"
	Updated   Action = "updated"
	Replaced  Action = "replaced" // a file install did not write; a backup was kept
	Unchanged Action = "unchanged"
	Removed   Action = "removed"
	Restored  Action = "restored" // the backup of a replaced file was put back
	Kept      Action = "kept"     // changed since install: left alone
	Absent    Action = "absent"   // already gone
)

// Change is one line of a Report.
type Change struct {
	Action Action
	Path   string // a file, or a node object such as "link village0"
	Note   string
}

// Report says what Install or Uninstall did.
type Report struct {
	Changes  []Change
	Warnings []string
}

// Changed reports whether anything on the node changed.
func (r *Report) Changed() bool {
	for _, c := range r.Changes {
		if c.Action != Unchanged && c.Action != Absent {
			return true
		}
	}
	return false
}

func (r *Report) add(a Action, path, note string) {
	r.Changes = append(r.Changes, Change{Action: a, Path: path, Note: note})
}

// String is the report as villaged prints it, one change per line.
func (r *Report) String() string {
	var b strings.Builder
	for _, c := range r.Changes {
		fmt.Fprintf(&b, "%-9s %s", c.Action, c.Path)
		if c.Note != "" {
			fmt.Fprintf(&b, " (%s)", c.Note)
		}
		b.WriteByte('\n')
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	if !r.Changed() {
		b.WriteString("nothing changed\n")
	}
	return b.String()
}

// Install copies the binaries and writes the conflist; see the package
// comment. The conflist is rendered and validated before any file is
// touched, and written after the binaries it names.
func Install(o Options) (*Report, error) {
	o.defaults()
	conf, networks, err := o.render()
	if err != nil {
		return nil, err
	}
	// Binaries are hashed and copied by streaming from BinSource, never held
	// in memory whole: the init container's memory limit is small and the
	// target may be a tmpfs that counts against it too.
	bins := make(map[string]string, len(o.Binaries))
	for _, name := range o.Binaries {
		if err := netconf.ValidatePluginType(name); err != nil {
			return nil, fmt.Errorf("invalid binary name: %w", err)
		}
		src := filepath.Join(o.BinSource, name)
		sum, _, exists, err := fileDigest(src)
		if err == nil && !exists {
			err = fs.ErrNotExist
		}
		if err != nil {
			return nil, fmt.Errorf("read binary to install %s: %w (is --bin-source right?)", src, err)
		}
		bins[name] = sum
	}
	dirs := []string{o.BinDir, o.ConfDir}
	if o.StageDir != "" {
		dirs = append(dirs, o.StageDir)
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	m, err := LoadManifest(o.StateDir)
	if err != nil {
		return nil, err
	}
	r := &Report{}
	want := map[string]bool{}
	for _, name := range o.Binaries {
		path := filepath.Join(o.BinDir, name)
		want[path] = true
		if err := o.placeFile(m, r, path, "binary", o.copyFrom(filepath.Join(o.BinSource, name), bins[name]), 0o755); err != nil {
			return r, err
		}
	}
	for _, name := range o.Companions {
		if err := o.placeCompanion(m, r, want, name); err != nil {
			return r, err
		}
	}
	confPath := filepath.Join(o.ConfDir, o.ConfName)
	if o.StageDir != "" {
		want[confPath] = true // the published copy of an earlier install stays
		confPath = filepath.Join(o.StageDir, o.ConfName)
	}
	want[confPath] = true
	if err := o.place(m, r, confPath, "conflist", conf, 0o644); err != nil {
		return r, err
	}
	if o.StageDir != "" {
		if err := o.recordPublished(m, conf); err != nil {
			return r, err
		}
	}
	// What an earlier install wrote and this one does not (another conflist
	// name, a binary no longer asked for) goes, as uninstall would take it.
	for _, rec := range slices.Clone(m.Files) {
		if want[rec.Path] {
			continue
		}
		if err := removeRecord(r, rec); err != nil {
			return r, err
		}
		m.drop(rec.Path)
		if err := m.save(o.StateDir); err != nil {
			return r, err
		}
	}
	m.Version = buildinfo.Version
	m.Networks = networks
	if err := m.save(o.StateDir); err != nil {
		return r, err
	}
	r.Warnings = append(r.Warnings, o.warnings(conf, confPath)...)
	return r, nil
}

// place writes data at path unless it is already there, keeping a backup of
// a file install did not write, and records it in the manifest.
// placeCompanion installs the companion plugin name from BinSource unless
// BinSource lacks it or the binary directory holds one that is not ours.
func (o *Options) placeCompanion(m *Manifest, r *Report, want map[string]bool, name string) error {
	if err := netconf.ValidatePluginType(name); err != nil {
		return fmt.Errorf("invalid companion plugin name: %w", err)
	}
	src := filepath.Join(o.BinSource, name)
	sum, _, exists, err := fileDigest(src)
	if err != nil {
		return fmt.Errorf("read companion plugin %s: %w", name, err)
	}
	if !exists {
		return nil // not shipped with this source; warnings name it if the conflist needs it
	}
	path := filepath.Join(o.BinDir, name)
	if _, err := os.Lstat(path); err == nil && m.record(path) == nil {
		r.add(Unchanged, path, "the node's own "+name+" is kept")
		return nil
	}
	want[path] = true
	return o.placeFile(m, r, path, "binary", o.copyFrom(src, sum), 0o755)
}

// content is what placeFile puts at a path: its sha256 and how to write it.
type content struct {
	sum   string
	write func(path string, mode os.FileMode) error
}

// copyFrom is the content of the file src, whose sha256 is sum, copied by
// streaming.
func (o *Options) copyFrom(src, sum string) content {
	return content{sum: sum, write: func(path string, mode os.FileMode) error { return copyAtomic(path, src, mode) }}
}

// recordPublished lists the copy the agent publishes of the staged conflist
// (ConfDir/ConfName, with the staged content) in the manifest, so uninstall
// takes it away first, as it does a conflist install wrote itself.
func (o *Options) recordPublished(m *Manifest, conf []byte) error {
	pub := filepath.Join(o.ConfDir, o.ConfName)
	rec := m.record(pub)
	if rec == nil {
		m.Files = append(m.Files, FileRecord{Path: pub, Kind: "conflist"})
		rec = &m.Files[len(m.Files)-1]
	}
	if sum := digest(conf); rec.SHA256 != sum {
		rec.SHA256 = sum
		return m.save(o.StateDir)
	}
	return nil
}

func (o *Options) place(m *Manifest, r *Report, path, kind string, data []byte, mode os.FileMode) error {
	return o.placeFile(m, r, path, kind, content{
		sum:   digest(data),
		write: func(path string, mode os.FileMode) error { return writeAtomic(path, data, mode) },
	}, mode)
}

func (o *Options) placeFile(m *Manifest, r *Report, path, kind string, c content, mode os.FileMode) error {
	sum := c.sum
	have, haveMode, exists, err := fileDigest(path)
	if err != nil {
		return err
	}
	rec := m.record(path)
	if rec == nil {
		m.Files = append(m.Files, FileRecord{Path: path, Kind: kind})
		rec = &m.Files[len(m.Files)-1]
	}
	action, note := Created, ""
	switch {
	case exists && have == sum:
		if haveMode == mode {
			r.add(Unchanged, path, "")
			if rec.SHA256 != sum {
				rec.SHA256 = sum
				return m.save(o.StateDir)
			}
			return nil
		}
		if err := os.Chmod(path, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", path, err)
		}
		rec.SHA256 = sum
		r.add(Updated, path, fmt.Sprintf("mode %v -> %v", haveMode, mode))
		return m.save(o.StateDir)
	case exists && rec.SHA256 == have:
		action = Updated
	case exists && rec.Backup == "":
		// Not ours: keep it for uninstall to put back.
		backup, err := o.backup(path, haveMode)
		if err != nil {
			return err
		}
		rec.Backup = backup
		if err := m.save(o.StateDir); err != nil {
			return err
		}
		action, note = Replaced, "the previous file is kept in "+backup+" and comes back on uninstall"
	case exists:
		action, note = Updated, "it had changed since the last install"
	}
	if err := c.write(path, mode); err != nil {
		return err
	}
	rec.SHA256 = sum
	r.add(action, path, note)
	return m.save(o.StateDir)
}

func (o *Options) backup(path string, mode os.FileMode) (string, error) {
	dir := filepath.Join(o.StateDir, "backup")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create backup directory %s: %w", dir, err)
	}
	dst := filepath.Join(dir, filepath.Base(path)+"."+digest([]byte(path))[:12])
	if err := copyAtomic(dst, path, mode); err != nil {
		return "", err
	}
	return dst, nil
}

// render fills the template and checks the result is a conflist whose
// village entries Village itself accepts.
func (o *Options) render() ([]byte, []NetworkRecord, error) {
	out, err := Render(o.Template, o.lookup)
	if err != nil {
		return nil, nil, fmt.Errorf("render %s: %w", o.TemplateName, err)
	}
	if !strings.HasSuffix(o.ConfName, ".conflist") || strings.ContainsAny(o.ConfName, "/\x00") {
		return nil, nil, fmt.Errorf("invalid conflist name %q: a file name ending in .conflist", o.ConfName)
	}
	list, err := libcni.ConfListFromBytes(out)
	if err != nil {
		return nil, nil, fmt.Errorf("rendered %s is not a valid conflist: %w", o.TemplateName, err)
	}
	rec := NetworkRecord{Name: list.Name}
	entries, err := netconf.FromList(out)
	if err != nil && !errors.Is(err, netconf.ErrNoVillage) {
		return nil, nil, fmt.Errorf("rendered %s: %w", o.TemplateName, err)
	}
	for _, e := range entries {
		nc, err := netconf.Parse(e.Bytes, "")
		if err != nil {
			return nil, nil, fmt.Errorf("rendered %s: plugins[%d] (village): %w", o.TemplateName, e.Index, err)
		}
		rec.Bridges = appendNew(rec.Bridges, nc.Bridge)
		if b := nc.Overlay; b != nil && (b.Type == string(overlay.ModeVXLAN) || b.Type == string(overlay.ModeAuto)) {
			vni := b.VNI
			if vni == 0 {
				vni = overlay.DefaultVNI
			}
			rec.VXLAN = appendNew(rec.VXLAN, overlay.DeviceName(vni))
		}
		if nc.LAN != nil && nc.LAN.HostShim {
			master := nc.LAN.Master
			if master == "" {
				master, _ = o.lookup("DEFAULT_IFACE")
			}
			if master != "" {
				rec.Shims = appendNew(rec.Shims, macvlan.ShimName(master))
			}
		}
	}
	return out, []NetworkRecord{rec}, nil
}

func appendNew(s []string, v string) []string {
	if v == "" || slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// warnings point at what would keep the installed network from working:
// another config that runtimes would pick first, a plugin the conflist
// names that is not in the binary directory.
func (o *Options) warnings(conf []byte, confPath string) []string {
	var w []string
	files, err := libcni.ConfFiles(o.ConfDir, []string{".conf", ".conflist", ".json"})
	if err == nil && len(files) > 0 {
		slices.Sort(files)
		if files[0] != confPath {
			w = append(w, fmt.Sprintf("runtimes pick %s before %s (the first file in name order wins); remove it or install with --conf-name sorting first, e.g. 00-village.conflist", files[0], confPath))
		}
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return w
	}
	for _, p := range list.Plugins {
		types := []string{p.Network.Type}
		if p.Network.IPAM.Type != "" {
			types = append(types, p.Network.IPAM.Type)
		}
		for _, t := range types {
			if _, err := os.Stat(filepath.Join(o.BinDir, t)); err != nil {
				w = append(w, fmt.Sprintf("the conflist uses plugin %q, which is not in %s", t, o.BinDir))
			}
		}
	}
	return w
}
