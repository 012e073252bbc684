package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/nodelocal"
)

// TestWatchFile: a write of the watched file (nodelocal.WriteFile renames
// over it) and its removal each wake the watcher; a write of another file
// in the directory does not; the directory removed and made again is
// still watched.
func TestWatchFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "request")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, err := watchFile(ctx, path, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	woke := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the watcher did not wake", what)
		}
	}
	quiet := func(what string) {
		t.Helper()
		// Something that wakes it afterwards proves the order: the
		// watcher reads events in order, so a wake-up from what is
		// already in the channel before the marker.
		if err := nodelocal.WriteFile(path, []byte("marker"), 0o600); err != nil {
			t.Fatal(err)
		}
		woke(what + " then the marker")
		select {
		case <-changed:
			t.Fatalf("%s woke the watcher", what)
		default:
		}
	}
	if err := nodelocal.WriteFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	woke("the first write")
	quiet("nothing")
	if err := nodelocal.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	quiet("another file's write")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	woke("the removal")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	woke("the directory's removal")
	// The watcher makes the directory again and watches it.
	testenv.WaitFor(t, "the watcher makes the directory again", func() error {
		_, err := os.Stat(dir)
		return err
	})
	for len(changed) > 0 {
		<-changed
	}
	if err := nodelocal.WriteFile(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	woke("a write in the directory made again")
}
