package table

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The ready file counts only while a holder keeps its lock: missing, left
// behind by a holder that is gone, and held are told apart.
func TestReadyFile(t *testing.T) {
	dir := t.TempDir()
	path := ReadyPath(dir, "net")
	if path != filepath.Join(dir, "net", ReadyName) {
		t.Fatalf("ReadyPath = %s", path)
	}
	want := func(what string, ready bool) {
		t.Helper()
		got, err := IsReady(path)
		if err != nil || got != ready {
			t.Fatalf("%s: IsReady = %v, %v; want %v", what, got, err, ready)
		}
	}
	want("no file", false)
	f, err := HoldReady(path)
	if err != nil {
		t.Fatal(err)
	}
	want("held", true)
	want("held, asked again", true) // IsReady's own lock never outlives it
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the file itself stays: %v", err)
	}
	want("left behind by a holder that is gone", false)
	g, err := HoldReady(path)
	if err != nil {
		t.Fatalf("holding a left-behind file again: %v", err)
	}
	want("held by a new holder", true)
	g.Close()
}

// A holder in another process that is SIGKILLed (an agent killed) leaves
// the file not ready: the kernel drops the lock with the process.
func TestReadyFileHolderKilled(t *testing.T) {
	path := ReadyPath(t.TempDir(), "net")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	// flock(1) takes the same exclusive flock HoldReady takes, and the
	// process that holds it (cat, by then) is killed.
	cmd, _ := lockWith(t, "--exclusive", path)
	deadline := time.Now().Add(time.Minute)
	for {
		ready, err := IsReady(path)
		if err != nil {
			t.Fatal(err)
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other process's lock was never seen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // the process is gone, and its descriptors with it
	if ready, err := IsReady(path); err != nil || ready {
		t.Fatalf("after the holder was killed: IsReady = %v, %v; want false", ready, err)
	}
}

// The ready file is root-only (0600, an existing file's looser mode put
// back), and a lock someone else holds makes HoldReady fail with an error
// naming the file instead of hanging the controller.
func TestReadyFileForeignHolder(t *testing.T) {
	path := ReadyPath(t.TempDir(), "net")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	// A local user's lock: flock(1) holding a shared lock (all a 0644 file
	// needs) until the test closes cat's stdin.
	cmd, stdin := lockWith(t, "--shared", path)
	deadline := time.Now().Add(time.Minute)
	for held(t, path) == false {
		if time.Now().After(deadline) {
			t.Fatal("the other process's lock was never seen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() {
		f, err := HoldReady(path)
		if f != nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "another process") {
			t.Fatalf("HoldReady with a foreign lock held: %v; want an error naming %s", err, path)
		}
		t.Logf("HoldReady: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("HoldReady still waiting a minute after a foreign lock was taken")
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("ready file mode %v, want 0600", st.Mode().Perm())
	}
	stdin.Close()
	_ = cmd.Wait()
	f, err := HoldReady(path)
	if err != nil {
		t.Fatalf("after the foreign holder left: %v", err)
	}
	f.Close()
}

// held says whether someone holds a lock on path (an exclusive lock of
// ours cannot be taken).
func held(t *testing.T, path string) bool {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
}

// lockWith starts flock(1) holding a lock of mode ("--exclusive",
// "--shared") on path, then becoming cat (--no-fork), which holds it
// until the test closes the returned stdin or kills the process. One
// process: with a fork, a child that had not yet closed its copy of the
// descriptor would hold the lock a moment after its parent was killed.
func lockWith(t *testing.T, mode, path string) (*exec.Cmd, io.WriteCloser) {
	cmd := exec.Command("flock", mode, "--no-fork", path, "cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("flock(1) (util-linux) is needed: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); stdin.Close(); _ = cmd.Wait() })
	return cmd, stdin
}
