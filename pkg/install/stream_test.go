package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// bigBinary is the size of the plugin the memory test installs: far above
// the peak RSS it allows, so holding it whole in memory cannot pass.
const bigBinary = 192 << 20

// TestInstallStreamsBinaries installs a 192 MiB plugin, then again after the
// installed copy changed (hashing both files and backing up the changed one), in a child process, and reads
// the child's peak RSS from wait4: streaming keeps it far below the file's
// size, whereas reading the file whole (let alone source and target) exceeds
// the bound by at least 96 MiB.
func TestInstallStreamsBinaries(t *testing.T) {
	if dir := os.Getenv("VILLAGE_INSTALL_STREAM_CHILD"); dir != "" {
		streamChild(t, dir)
		return
	}
	s := newSandbox(t)
	f, err := os.OpenFile(filepath.Join(s.src, "village"), os.O_WRONLY|os.O_TRUNC, 0o755)
	must(t, err)
	// A few real bytes at both ends, the rest a hole: the content is still
	// read, hashed and copied in full.
	_, err = f.WriteAt([]byte("#!binary village big\n"), 0)
	must(t, err)
	_, err = f.WriteAt([]byte("end\n"), bigBinary-4)
	must(t, err)
	must(t, f.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestInstallStreamsBinaries$", "-test.count=1")
	cmd.Env = append(os.Environ(), "VILLAGE_INSTALL_STREAM_CHILD="+s.root)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child install: %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(s.bin, "village"))
	must(t, err)
	if fi.Size() != bigBinary {
		t.Fatalf("installed village is %d bytes, want %d", fi.Size(), bigBinary)
	}
	if got := read(t, filepath.Join(s.bin, "village")); got[:21] != "#!binary village big\n" || got[len(got)-4:] != "end\n" {
		t.Fatalf("installed village differs from its source")
	}
	maxrss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB on Linux
	t.Logf("child peak RSS %d MiB installing a %d MiB plugin twice", maxrss>>20, bigBinary>>20)
	if maxrss >= bigBinary/2 {
		t.Fatalf("install's peak RSS is %d MiB for a %d MiB binary: it holds binaries in memory", maxrss>>20, bigBinary>>20)
	}
}

// streamChild runs in the child: a fresh install, then one over a changed
// copy (install hashes it, backs it up as a file it did not write, and
// rewrites it).
func streamChild(t *testing.T, root string) {
	s := &sandbox{root: root, src: filepath.Join(root, "src"), bin: filepath.Join(root, "opt/cni/bin"),
		conf: filepath.Join(root, "etc/cni/net.d"), state: filepath.Join(root, "var/lib/village")}
	if a := actions(mustInstall(t, s.opts()))[filepath.Join(s.bin, "village")]; a != Created {
		t.Fatalf("first install: village %v, want %v", a, Created)
	}
	f, err := os.OpenFile(filepath.Join(s.bin, "village"), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt([]byte("X"), 1<<20)
	must(t, err)
	must(t, f.Close())
	if a := actions(mustInstall(t, s.opts()))[filepath.Join(s.bin, "village")]; a != Replaced {
		t.Fatalf("second install: village %v, want %v", a, Replaced)
	}
}
