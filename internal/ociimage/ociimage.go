// Package ociimage writes single-layer OCI images as OCI image-layout tar
// archives (what `ctr images import` and `podman load` read), byte for byte
// reproducibly: entries sorted, every mtime fixed (Image.Created: the Unix
// epoch, or the commit time SOURCE_DATE_EPOCH gives), owner root, no host user
// or group names, gzip without name or time. The same files and time give the
// same archive, so the image digest follows the content only.
//
// It makes the image the DaemonSet names (see Village in village.go and
// `./build_linux.sh image`) and the small images the runtime tests run.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Media types of the OCI image specification v1.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// File is one entry of the image's file system.
type File struct {
	Path string      // absolute path inside the image, e.g. /usr/local/bin/villaged
	Mode os.FileMode // permission bits; 0 means 0o755 for executables and dirs, 0o644 for Data
	Data []byte      // contents of a regular file
	Link string      // symlink target (Data is ignored)
	Dir  bool        // an (empty) directory
}

// Image is what goes into the archive.
type Image struct {
	Name       string   // full reference, e.g. ghcr.io/village-cni/village:v0.1.0
	Entrypoint []string // may be empty
	Cmd        []string
	Env        []string // KEY=VALUE; PATH is set when missing
	WorkingDir string
	Files      []File
	// Created is the image's creation time and every entry's mtime; zero
	// means the Unix epoch.
	Created time.Time
	// Platform is what the image runs on; zero means this machine's
	// (runtime.GOARCH).
	Platform Platform
}

// Platform is an image's OS/architecture/variant as the OCI config and
// index record it (linux only).
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// ParsePlatform reads "linux/arm64", "linux/arm/v7" or "arm64".
func ParsePlatform(s string) (Platform, error) {
	parts := strings.Split(strings.TrimPrefix(s, "linux/"), "/")
	if len(parts) > 2 || parts[0] == "" {
		return Platform{}, fmt.Errorf("platform %q: want linux/ARCH[/VARIANT]", s)
	}
	p := Platform{Architecture: parts[0], OS: "linux"}
	if len(parts) == 2 {
		p.Variant = parts[1]
	}
	return p, nil
}

// String is the platform as os/arch[/variant].
func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

func (p Platform) orHost() Platform {
	if p.Architecture == "" {
		p = Platform{Architecture: runtime.GOARCH}
		if runtime.GOARCH == "arm" {
			p.Variant = "v7"
		}
	}
	p.OS = "linux"
	return p
}

var epoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

type blob struct {
	digest string
	data   []byte
}

func newBlob(b []byte) blob {
	sum := sha256.Sum256(b)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: b}
}

// Write writes img as an OCI image-layout tar archive to w. The index names
// the image with both the containerd annotation (full reference, what `ctr
// images import` uses) and the OCI ref.name annotation.
func Write(w io.Writer, img Image) error {
	if img.Name == "" {
		return fmt.Errorf("image has no name")
	}
	man, blobs, err := manifest(img)
	if err != nil {
		return err
	}
	man.Annotations = names(img.Name)
	return writeLayout(w, man, blobs, mtimeOf(img.Created))
}

// WriteIndex writes one OCI image-layout tar archive holding imgs, one per
// platform, behind one image index named name: `ctr images import` and
// `podman load` pick the manifest of the machine's platform from it.
func WriteIndex(w io.Writer, name string, created time.Time, imgs []Image) error {
	if name == "" {
		return fmt.Errorf("image index has no name")
	}
	var mans []descriptor
	var blobs []blob
	seen := map[string]bool{}
	for _, img := range imgs {
		img.Created = created
		p := img.Platform.orHost().String()
		if seen[p] {
			return fmt.Errorf("image index %q: platform %s twice", name, p)
		}
		seen[p] = true
		man, bs, err := manifest(img)
		if err != nil {
			return err
		}
		mans = append(mans, man)
		blobs = append(blobs, bs...)
	}
	indexJSON, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": mans})
	if err != nil {
		return err
	}
	idx := newBlob(indexJSON)
	top := descriptor{MediaType: mediaIndex, Digest: idx.digest, Size: int64(len(idx.data)), Annotations: names(name)}
	return writeLayout(w, top, append(blobs, idx), mtimeOf(created))
}

func mtimeOf(created time.Time) time.Time {
	if created.IsZero() {
		return epoch
	}
	return created.UTC().Truncate(time.Second)
}

// names are the index annotations naming an image: the full reference for
// containerd, the tag for the OCI layout (podman).
func names(name string) map[string]string {
	tag := name
	if i := strings.LastIndex(tag, ":"); i > strings.LastIndex(tag, "/") {
		tag = tag[i+1:]
	} else {
		tag = "latest"
	}
	return map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": tag,
	}
}

// manifest returns the descriptor of img's manifest (with its platform) and
// the blobs it needs: layer, config, manifest.
func manifest(img Image) (descriptor, []blob, error) {
	mtime := mtimeOf(img.Created)
	plat := img.Platform.orHost()
	layerTar, err := layer(img.Files, mtime)
	if err != nil {
		return descriptor{}, nil, fmt.Errorf("layer of image %q: %w", img.Name, err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return descriptor{}, nil, err
	}
	zw.ModTime = epoch // explicit: no time in the gzip header
	if _, err := zw.Write(layerTar); err != nil {
		return descriptor{}, nil, err
	}
	if err := zw.Close(); err != nil {
		return descriptor{}, nil, err
	}
	diffID := newBlob(layerTar).digest
	layerBlob := newBlob(gz.Bytes())

	env := img.Env
	if !hasKey(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cfg := map[string]any{
		"created":      mtime.Format(time.RFC3339),
		"architecture": plat.Architecture,
		"os":           plat.OS,
		"config": map[string]any{
			"Env":        env,
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"WorkingDir": img.WorkingDir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	}
	if plat.Variant != "" {
		cfg["variant"] = plat.Variant
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return descriptor{}, nil, err
	}
	cfgBlob := newBlob(cfgJSON)
	manJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: cfgBlob.digest, Size: int64(len(cfgBlob.data))},
		"layers":        []descriptor{{MediaType: mediaLayerGz, Digest: layerBlob.digest, Size: int64(len(layerBlob.data))}},
	})
	if err != nil {
		return descriptor{}, nil, err
	}
	manBlob := newBlob(manJSON)
	d := descriptor{MediaType: mediaManifest, Digest: manBlob.digest, Size: int64(len(manBlob.data)), Platform: &plat}
	return d, []blob{layerBlob, cfgBlob, manBlob}, nil
}

// writeLayout writes the OCI layout: index.json naming top, oci-layout, and
// the blobs (each once), sorted.
func writeLayout(w io.Writer, top descriptor, blobs []blob, mtime time.Time) error {
	indexJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{top},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	entries := []File{
		{Path: "blobs", Dir: true},
		{Path: "blobs/sha256", Dir: true},
		{Path: "index.json", Data: indexJSON},
		{Path: "oci-layout", Data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	}
	have := map[string]bool{}
	for _, b := range blobs {
		if have[b.digest] {
			continue
		}
		have[b.digest] = true
		entries = append(entries, File{Path: "blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:"), Data: b.data, Mode: 0o644})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	for _, e := range entries {
		if err := writeEntry(tw, e.Path, e, mtime); err != nil {
			return err
		}
	}
	return tw.Close()
}

func hasKey(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// layer returns the uncompressed layer tar: every file plus its missing
// parent directories, sorted by path.
func layer(files []File, mtime time.Time) ([]byte, error) {
	byPath := map[string]File{}
	for _, f := range files {
		p := path.Clean("/" + f.Path)
		if p == "/" {
			continue
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("%s appears twice", p)
		}
		f.Path = p
		byPath[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		if err := writeEntry(tw, strings.TrimPrefix(p, "/"), byPath[p], mtime); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, name string, f File, mtime time.Time) error {
	h := &tar.Header{Name: name, ModTime: mtime, Format: tar.FormatPAX, Uid: 0, Gid: 0}
	mode := f.Mode.Perm()
	switch {
	case f.Dir:
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
		if mode == 0 {
			mode = 0o755
		}
	case f.Link != "":
		h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		mode = 0o777
	default:
		h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		if mode == 0 {
			mode = 0o644
		}
	}
	h.Mode = int64(mode)
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("tar header of %s: %w", name, err)
	}
	if h.Typeflag == tar.TypeReg {
		if _, err := tw.Write(f.Data); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// WriteFile writes img to path atomically (temp file and rename).
func WriteFile(p string, img Image) error {
	return writeFile(p, func(w io.Writer) error { return Write(w, img) })
}

// WriteIndexFile writes WriteIndex's archive to path atomically.
func WriteIndexFile(p, name string, created time.Time, imgs []Image) error {
	return writeFile(p, func(w io.Writer) error { return WriteIndex(w, name, created, imgs) })
}

func writeFile(p string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(path.Dir(p), ".ociimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// HostFile reads a file of this machine into an image File at dest.
func HostFile(src, dest string) (File, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return File{}, fmt.Errorf("read %s for the image: %w", src, err)
	}
	st, err := os.Stat(src)
	if err != nil {
		return File{}, err
	}
	return File{Path: dest, Data: b, Mode: st.Mode().Perm()}, nil
}
