package table

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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
	// flock(1) takes the same exclusive flock HoldReady takes (--close: its
	// child, sleep, does not inherit the descriptor, as villaged opens it
	// close-on-exec).
	// Its child, cat, ends when the test closes its stdin.
	cmd := exec.Command("flock", "--exclusive", "--close", path, "cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("flock(1) (util-linux) is needed: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); stdin.Close(); _ = cmd.Wait() })
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
