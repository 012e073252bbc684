package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/install"
)

// entries lists an archive's tar headers (name, type, mtime, owner) and
// returns the contents of regular files by name.
func entries(t *testing.T, b []byte) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var hs []*tar.Header
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs, files
		}
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
		if h.Typeflag == tar.TypeReg {
			files[h.Name], _ = io.ReadAll(tr)
		}
	}
}

func TestWrite(t *testing.T) {
	img := Image{Name: "example.test/x:v1", Cmd: []string{"x"}, Files: []File{
		{Path: "/usr/local/bin/x", Data: []byte("binary"), Mode: 0o755},
		{Path: "/etc/a", Data: []byte("a")},
		{Path: "/usr/sbin/iptables", Link: "xtables-nft-multi"},
		{Path: "/tmp", Dir: true, Mode: 0o777},
	}}
	var a, b bytes.Buffer
	if err := Write(&a, img); err != nil {
		t.Fatal(err)
	}
	// Files in another order give the same bytes.
	img2 := img
	img2.Files = []File{img.Files[3], img.Files[2], img.Files[1], img.Files[0]}
	if err := Write(&b, img2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same files in another order gave a different archive")
	}
	hs, files := entries(t, a.Bytes())
	var names []string
	for _, h := range hs {
		names = append(names, h.Name)
		if h.ModTime.Unix() != 0 || h.Uid != 0 || h.Gid != 0 || h.Uname != "" {
			t.Errorf("%s: mtime %v owner %d/%d %q; want epoch, root, no names", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname)
		}
	}
	if got := strings.Join(names, " "); !strings.HasPrefix(got, "blobs/ blobs/sha256/ blobs/sha256/") || !strings.HasSuffix(got, "index.json oci-layout") {
		t.Errorf("archive entries %s", got)
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != img.Name || m.Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("index annotations %v", m.Annotations)
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")], &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(files["blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:")]))
	if err != nil {
		t.Fatal(err)
	}
	layerTar, _ := io.ReadAll(zr)
	lhs, lfiles := entries(t, layerTar)
	var lnames []string
	for _, h := range lhs {
		lnames = append(lnames, h.Name)
	}
	want := "etc/ etc/a tmp/ usr/ usr/local/ usr/local/bin/ usr/local/bin/x usr/sbin/ usr/sbin/iptables"
	if got := strings.Join(lnames, " "); got != want {
		t.Errorf("layer entries\n got %s\nwant %s", got, want)
	}
	if string(lfiles["usr/local/bin/x"]) != "binary" {
		t.Errorf("layer file content %q", lfiles["usr/local/bin/x"])
	}
	for _, h := range lhs {
		switch h.Name {
		case "usr/local/bin/x":
			if h.Mode != 0o755 {
				t.Errorf("x mode %o", h.Mode)
			}
		case "tmp/":
			if h.Mode != 0o777 {
				t.Errorf("tmp mode %o", h.Mode)
			}
		case "usr/sbin/iptables":
			if h.Linkname != "xtables-nft-multi" {
				t.Errorf("iptables link %q", h.Linkname)
			}
		}
	}
}

// TestCreated: a given creation time is every entry's mtime and the
// config's "created"; the bytes still depend on nothing else.
func TestCreated(t *testing.T) {
	when := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	img := Image{Name: "example.test/x:v1", Created: when, Files: []File{{Path: "/a", Data: []byte("a")}}}
	var a, b bytes.Buffer
	if err := Write(&a, img); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two writes differ")
	}
	hs, files := entries(t, a.Bytes())
	for _, h := range hs {
		if !h.ModTime.Equal(when) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, when)
		}
	}
	found := false
	for name, body := range files {
		if strings.Contains(string(body), `"created":"2026-12-01T10:00:00Z"`) {
			found = true
		} else if strings.HasPrefix(name, "blobs/") && strings.Contains(string(body), `"created"`) {
			t.Errorf("config %s: %s", name, body)
		}
	}
	if !found {
		t.Error("no config says created 2026-12-01T10:00:00Z")
	}
}

func TestWriteErrors(t *testing.T) {
	for name, img := range map[string]Image{
		"no name":   {Files: []File{{Path: "/a"}}},
		"duplicate": {Name: "x:1", Files: []File{{Path: "/a"}, {Path: "a"}}},
	} {
		if err := Write(io.Discard, img); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestVillageReproducible builds the DaemonSet image twice from the same
// binaries: the same bytes.
func TestVillageReproducible(t *testing.T) {
	bin := t.TempDir()
	files := append(VillageBinaries, XtablesWrapper)
	for _, b := range install.Companions {
		files = append(files, filepath.Join("ref", b))
	}
	if err := os.Mkdir(filepath.Join(bin, "ref"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range files {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!"+b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var out [2][]byte
	for i := range out {
		img, err := Village(VillageOptions{Name: "example.test/village:v1", BinDir: bin})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "img.tar")
		if err := WriteFile(p, img); err != nil {
			t.Fatal(err)
		}
		out[i], _ = os.ReadFile(p)
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Error("two builds of the image differ")
	}
}
