package kube_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/crienv"
	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/internal/testenv"
)

// The images the selected upstream tests run, under the exact names
// `e2e.test --list-images` prints for Kubernetes v1.37.2 (nothing is pulled:
// every node imports these archives), and the cluster DNS image.
const (
	agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	// The EndpointSlice and Endpoints tests only need a container that
	// runs and declares ports; agnhost's test-webserver on port 80 stands
	// in for nginx.
	nginxImage   = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	busyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	// The Service endpoints latency test runs a Deployment of the pause
	// image.
	pauseImage   = "registry.k8s.io/pause:3.10.2"
	corednsImage = "village.test/coredns:1"
)

// conformanceImages are the OCI archives of those images.
type conformanceImages struct {
	archives []string
}

// hostFiles reads host files into image files at the same path, or at
// dest when given as src=dest.
func hostFiles(paths ...string) ([]ociimage.File, error) {
	var files []ociimage.File
	for _, p := range paths {
		src, dest, ok := strings.Cut(p, "=")
		if !ok {
			dest = src
		}
		f, err := ociimage.HostFile(src, dest)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// elfWithLibs is a dynamically linked host program at dest plus every
// library ldd resolves for it and the loader, each at its host path.
func elfWithLibs(src, dest string) ([]ociimage.File, error) {
	libs, err := ociimage.SharedLibs([]string{src})
	if err != nil {
		return nil, err
	}
	return hostFiles(append([]string{src + "=" + dest}, libs...)...)
}

// busyboxFiles are Debian's busybox-static at /bin/busybox with a link in
// /bin for every applet except those in omit.
func busyboxFiles(omit ...string) ([]ociimage.File, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox not found (scripts/deps.sh installs busybox-static): %w", err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	f, err := ociimage.HostFile(bb, "/bin/busybox")
	if err != nil {
		return nil, err
	}
	files := []ociimage.File{f}
	skip := map[string]bool{"busybox": true}
	for _, o := range omit {
		skip[o] = true
	}
	for _, a := range strings.Fields(string(out)) {
		if !skip[a] && !strings.ContainsAny(a, "[]") {
			files = append(files, ociimage.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	files = append(files, ociimage.File{Path: "/bin/[", Link: "busybox"})
	return files, nil
}

// agnhostFiles are the agnhost image's file system: /agnhost (and the
// agnhost-2 link the entrypoint tests use), dash as /bin/sh, busybox's
// applets except nc and sh (so `nc` in a test's shell command is
// netcat-openbsd: the tests pass -u, -w, -z as OpenBSD's nc reads them),
// curl with its libraries, /uploads for netexec, porter's test
// certificate, /tmp.
func agnhostFiles(kubeDir string) ([]ociimage.File, error) {
	files, err := hostFiles(filepath.Join(kubeDir, "agnhost") + "=/agnhost")
	if err != nil {
		return nil, err
	}
	bb, err := busyboxFiles("nc", "sh", "ash", "wget")
	if err != nil {
		return nil, err
	}
	files = append(files, bb...)
	for _, p := range []struct{ src, dest string }{
		{"/usr/bin/dash", "/bin/sh"},
		{"/usr/bin/nc.openbsd", "/usr/bin/nc"},
		{"/usr/bin/curl", "/usr/bin/curl"},
	} {
		if _, err := os.Stat(p.src); err != nil {
			return nil, fmt.Errorf("the agnhost image carries %s (scripts/deps.sh installs dash, netcat-openbsd, curl): %w", p.src, err)
		}
		fs, err := elfWithLibs(p.src, p.dest)
		if err != nil {
			return nil, err
		}
		files = append(files, fs...)
	}
	files = dedupe(files)
	files = append(files,
		ociimage.File{Path: "/agnhost-2", Link: "agnhost"},
		ociimage.File{Path: "/uploads", Dir: true},
		ociimage.File{Path: "/tmp", Dir: true, Mode: 0o777},
	)
	// porter's TLS ports serve the test certificate of the agnhost
	// source (relative names, resolved in the image's working directory /).
	porter := filepath.Join(kubecluster.KubeDir(), "porter")
	certs, err := hostFiles(filepath.Join(porter, "localhost.crt")+"=/localhost.crt", filepath.Join(porter, "localhost.key")+"=/localhost.key")
	if err != nil {
		return nil, fmt.Errorf("%w (scripts/kube.sh copies porter's certificate there from the k8s.io/kubernetes module)", err)
	}
	files = append(files, certs...)
	// libc's resolver and getent read these; curl resolves Service names.
	etc, err := hostFiles("/etc/protocols", "/etc/services")
	if err != nil {
		return nil, err
	}
	files = append(files, etc...)
	files = append(files, ociimage.File{Path: "/etc/nsswitch.conf", Data: []byte("hosts: files dns\n")})
	return files, nil
}

// dedupe drops later files at a path already taken (shared libraries
// several programs link).
func dedupe(files []ociimage.File) []ociimage.File {
	seen := map[string]bool{}
	var out []ociimage.File
	for _, f := range files {
		if !seen[f.Path] {
			seen[f.Path] = true
			out = append(out, f)
		}
	}
	return out
}

// buildConformanceImages writes the archives into dir.
func buildConformanceImages(t *testing.T, dir string) conformanceImages {
	t.Helper()
	kubeDir := kubecluster.KubeDir()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// crienv's pause binary; its archives are not used here.
	pauseDir := t.TempDir()
	if _, _, err := crienv.BuildImages(root, pauseDir); err != nil {
		t.Fatal(err)
	}
	agn, err := agnhostFiles(kubeDir)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := busyboxFiles()
	if err != nil {
		t.Fatal(err)
	}
	bb = append(bb, ociimage.File{Path: "/tmp", Dir: true, Mode: 0o777})
	pause, err := hostFiles(filepath.Join(pauseDir, "pause") + "=/pause")
	if err != nil {
		t.Fatal(err)
	}
	dns, err := hostFiles(filepath.Join(kubeDir, "coredns") + "=/coredns")
	if err != nil {
		t.Fatalf("%v: scripts/kube.sh builds coredns", err)
	}
	images := []ociimage.Image{
		{Name: agnhostImage, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Files: agn},
		{Name: nginxImage, Entrypoint: []string{"/agnhost", "test-webserver"}, Files: agn},
		{Name: busyboxImage, Cmd: []string{"sh"}, Files: bb},
		{Name: pauseImage, Entrypoint: []string{"/pause"}, Files: pause},
		{Name: corednsImage, Entrypoint: []string{"/coredns"}, Files: dns},
	}
	var ci conformanceImages
	for i, img := range images {
		p := filepath.Join(dir, fmt.Sprintf("conformance-%d.tar", i))
		if err := ociimage.WriteFile(p, img); err != nil {
			t.Fatalf("image %s: %v", img.Name, err)
		}
		ci.archives = append(ci.archives, p)
	}
	return ci
}
