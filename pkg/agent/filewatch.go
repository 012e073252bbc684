package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchFile sends on the returned channel (capacity 1, the latest only)
// whenever path is written, replaced (nodelocal.WriteFile renames over it)
// or removed, until ctx is done. It watches path's directory with inotify,
// so a file nobody writes costs no wake-up at all. The directory must
// exist; a directory removed and made again is watched again.
func watchFile(ctx context.Context, path string, logf func(string, ...any)) (<-chan struct{}, error) {
	dir, name := filepath.Split(path)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	const mask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	// Non-blocking: the runtime's poller waits, and Close wakes the Read.
	f := os.NewFile(uintptr(fd), "inotify:"+dir)
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	ch := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) {
					logf("watching %s: %v", path, err)
				}
				return
			}
			hit := false
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nb := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				off += unix.SizeofInotifyEvent + int(ev.Len)
				switch {
				case ev.Mask&unix.IN_Q_OVERFLOW != 0:
					hit = true // events lost: look again
				case ev.Mask&unix.IN_IGNORED != 0:
					// The directory went away: make it again and watch
					// the new one (whoever writes path makes it too).
					hit = true
					if err := os.MkdirAll(dir, 0o755); err == nil {
						_, err = unix.InotifyAddWatch(fd, dir, mask)
					}
					if err != nil {
						logf("watching %s again: %v", path, err)
					}
				case cstr(nb) == name:
					hit = true
				}
			}
			if hit {
				latest(ch, struct{}{})
			}
		}
	}()
	return ch, nil
}

// cstr is b up to its first NUL (inotify pads names with NULs).
func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
