package table

import (
	"os"
	"path/filepath"
	"testing"
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
