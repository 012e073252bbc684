package crienv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/village-cni/village/internal/ociimage"
)

// Images made locally for pods (no registry is reachable from CI).
const (
	PauseImage = "village.test/pause:1"
	ToolsImage = "village.test/busybox:1"
)

// busyboxApplets are the commands of the tools image.
var busyboxApplets = []string{"sh", "sleep", "cat", "ip", "ping", "nc", "wget", "ls", "hostname"}

// BuildImages builds the pause program from the module at root and writes
// two OCI archives into dir: the sandbox image (pause alone) and a tools
// image (Debian's busybox-static with a few applets, plus /pause as a TCP
// answering server). It returns their paths.
func BuildImages(root, dir string) (pause, tools string, err error) {
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./internal/crienv/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("build pause: %w: %s", err, out.String())
	}
	p, err := ociimage.HostFile(bin, "/pause")
	if err != nil {
		return "", "", err
	}
	pause = filepath.Join(dir, "pause.tar")
	if err := ociimage.WriteFile(pause, ociimage.Image{Name: PauseImage, Entrypoint: []string{"/pause"}, Files: []ociimage.File{p}}); err != nil {
		return "", "", err
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return "", "", fmt.Errorf("busybox not found (scripts/deps.sh installs busybox-static): %w", err)
	}
	b, err := ociimage.HostFile(bb, "/bin/busybox")
	if err != nil {
		return "", "", err
	}
	files := []ociimage.File{p, b, {Path: "/tmp", Dir: true, Mode: 0o777}}
	for _, a := range busyboxApplets {
		files = append(files, ociimage.File{Path: "/bin/" + a, Link: "busybox"})
	}
	tools = filepath.Join(dir, "busybox.tar")
	if err := ociimage.WriteFile(tools, ociimage.Image{Name: ToolsImage, Cmd: []string{"sh"}, Files: files}); err != nil {
		return "", "", err
	}
	return pause, tools, nil
}
