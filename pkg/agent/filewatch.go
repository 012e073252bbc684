package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// watchFile sends on the returned channel (capacity 1, the latest only)
// whenever path is written, replaced (nodelocal.WriteFile renames over it)
// or removed, until ctx is done. It watches path's directory (fsnotify:
// inotify), so a file nobody writes costs no wake-up at all. The directory
// must exist; a directory removed and made again is watched again.
func watchFile(ctx context.Context, path string, logf func(string, ...any)) (<-chan struct{}, error) {
	dir := filepath.Dir(path)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	ch := make(chan struct{}, 1)
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				switch {
				case ev.Name == path:
					latest(ch, struct{}{})
				case ev.Name == dir && ev.Has(fsnotify.Remove|fsnotify.Rename):
					// The directory went away: make it again and watch
					// the new one (whoever writes path makes it too).
					latest(ch, struct{}{})
					if err := os.MkdirAll(dir, 0o755); err == nil {
						err = w.Add(dir)
					}
					if err != nil {
						logf("watching %s again: %v", path, err)
					}
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				latest(ch, struct{}{}) // events lost: look again
				if !errors.Is(err, fsnotify.ErrEventOverflow) {
					logf("watching %s: %v", path, err)
				}
			}
		}
	}()
	return ch, nil
}
