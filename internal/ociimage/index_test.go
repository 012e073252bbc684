package ociimage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// indexPlatforms are the DaemonSet image's platforms (build_linux.sh image).
var indexPlatforms = []Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64"},
	{OS: "linux", Architecture: "arm", Variant: "v7"},
}

// platformIndex writes an index of one image per platform, each holding
// /platform naming its platform.
func platformIndex(t *testing.T, name string) (string, []byte) {
	t.Helper()
	var imgs []Image
	for _, p := range indexPlatforms {
		imgs = append(imgs, Image{Platform: p, Cmd: []string{"/x"}, Files: []File{{Path: "/platform", Data: []byte(p.String())}}})
	}
	p := filepath.Join(t.TempDir(), "index.tar")
	if err := WriteIndexFile(p, name, time.Unix(1700000000, 0), imgs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

// TestWriteIndex: the top index names one nested index listing a manifest
// per platform, each config recording its own architecture and variant;
// two writes give the same bytes.
func TestWriteIndex(t *testing.T) {
	_, a := platformIndex(t, "example.test/x:v1")
	_, b := platformIndex(t, "example.test/x:v1")
	if !bytes.Equal(a, b) {
		t.Fatal("two writes of the index differ")
	}
	_, files := entries(t, a)
	blob := func(d descriptor) []byte { return files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")] }
	var top struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &top); err != nil || len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaIndex {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	if top.Manifests[0].Annotations["io.containerd.image.name"] != "example.test/x:v1" || top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("top annotations %v", top.Manifests[0].Annotations)
	}
	var idx struct{ Manifests []descriptor }
	if err := json.Unmarshal(blob(top.Manifests[0]), &idx); err != nil || len(idx.Manifests) != len(indexPlatforms) {
		t.Fatalf("nested index: %v %d manifests", err, len(idx.Manifests))
	}
	for i, m := range idx.Manifests {
		if m.Platform == nil || *m.Platform != indexPlatforms[i] {
			t.Errorf("manifest %d platform %+v, want %+v", i, m.Platform, indexPlatforms[i])
			continue
		}
		var man struct{ Config descriptor }
		var cfg Platform
		if err := json.Unmarshal(blob(m), &man); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(blob(man.Config), &cfg); err != nil || cfg != indexPlatforms[i] {
			t.Errorf("config of %s records %+v (%v)", indexPlatforms[i], cfg, err)
		}
	}
	if err := WriteIndex(&bytes.Buffer{}, "x:1", time.Time{}, []Image{{}, {}}); err == nil {
		t.Error("two images of one platform: no error")
	}
}

// hostPlatform is this machine's platform as the index names it.
func hostPlatform() string {
	return Platform{}.orHost().String()
}

// TestIndexImportPodman: podman load takes the machine's platform from the
// index.
func TestIndexImportPodman(t *testing.T) {
	requireRoot(t)
	tar, _ := platformIndex(t, "example.test/village-index:v1")
	dir := t.TempDir()
	podman := func(args ...string) string {
		t.Helper()
		base := []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}
		out, err := exec.Command("podman", append(base, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	podman("load", "-i", tar)
	if got := podman("image", "inspect", "--format", "linux/{{.Architecture}}", "example.test/village-index:v1"); !strings.HasPrefix(hostPlatform(), got) {
		t.Errorf("podman load picked %s, want %s", got, hostPlatform())
	}
	mnt := podman("image", "mount", "example.test/village-index:v1")
	t.Cleanup(func() { podman("image", "unmount", "example.test/village-index:v1") })
	got, err := os.ReadFile(filepath.Join(mnt, "platform"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != hostPlatform() {
		t.Errorf("podman load gave the image of %s, want %s", got, hostPlatform())
	}
}

// TestIndexImportContainerd: `ctr images import` of the index unpacks the
// machine's platform: the mounted image's /platform names it.
func TestIndexImportContainerd(t *testing.T) {
	requireRoot(t)
	tar, _ := platformIndex(t, "example.test/village-index:v1")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "c.sock")
	ctx, cancel := context.WithCancel(context.Background())
	d := exec.CommandContext(ctx, "containerd", "--config", cfg, "--root", filepath.Join(dir, "root"), "--state", filepath.Join(dir, "state"), "--address", sock)
	var log bytes.Buffer
	d.Stdout, d.Stderr = &log, &log
	if err := d.Start(); err != nil {
		t.Fatalf("containerd (scripts/deps.sh installs it): %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = d.Wait()
		if t.Failed() {
			t.Logf("containerd log:\n%s", log.String())
		}
	})
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command("ctr", append([]string{"--address", sock, "-n", "indextest"}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for i := 0; ; i++ {
		if _, err := ctr("version"); err == nil {
			break
		} else if i > 600 {
			t.Fatalf("containerd never answered on %s: %v", sock, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := ctr("images", "import", "--snapshotter", "native", tar); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := ctr("images", "mount", "--snapshotter", "native", "example.test/village-index:v1", mnt); err != nil {
		t.Fatalf("ctr images mount: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_ = syscall.Unmount(mnt, 0)
		_, _ = ctr("images", "unmount", "--snapshotter", "native", mnt)
	})
	got, err := os.ReadFile(filepath.Join(mnt, "platform"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != hostPlatform() {
		t.Errorf("ctr images import unpacked %s, want %s", got, hostPlatform())
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal(fmt.Sprintf("needs root (runs containerd/podman), GOARCH %s", runtime.GOARCH))
	}
}
