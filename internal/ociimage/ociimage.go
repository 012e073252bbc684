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
}

var epoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
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
	mtime := epoch
	if !img.Created.IsZero() {
		mtime = img.Created.UTC().Truncate(time.Second)
	}
	layerTar, err := layer(img.Files, mtime)
	if err != nil {
		return fmt.Errorf("layer of image %q: %w", img.Name, err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	zw.ModTime = epoch // explicit: no time in the gzip header
	if _, err := zw.Write(layerTar); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	diffID := newBlob(layerTar).digest
	layerBlob := newBlob(gz.Bytes())

	env := img.Env
	if !hasKey(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cfg := map[string]any{
		"created":      mtime.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env":        env,
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"WorkingDir": img.WorkingDir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgBlob := newBlob(cfgJSON)
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: cfgBlob.digest, Size: int64(len(cfgBlob.data))},
		"layers":        []descriptor{{MediaType: mediaLayerGz, Digest: layerBlob.digest, Size: int64(len(layerBlob.data))}},
	}
	manJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	manBlob := newBlob(manJSON)
	tag := img.Name
	if i := strings.LastIndex(tag, ":"); i > strings.LastIndex(tag, "/") {
		tag = tag[i+1:]
	} else {
		tag = "latest"
	}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests": []descriptor{{
			MediaType: mediaManifest, Digest: manBlob.digest, Size: int64(len(manBlob.data)),
			Annotations: map[string]string{
				"io.containerd.image.name":          img.Name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: runtime.GOARCH, OS: "linux"},
		}},
	}
	indexJSON, err := json.Marshal(index)
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
	for _, b := range []blob{layerBlob, cfgBlob, manBlob} {
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
	tmp, err := os.CreateTemp(path.Dir(p), ".ociimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := Write(tmp, img); err != nil {
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
