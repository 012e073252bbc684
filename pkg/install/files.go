package install

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// writeAtomic puts data at path with mode: a temporary file in the same
// directory, written, chmod'ed and fsync'ed, then renamed over path, and the
// directory fsync'ed. A reader (a runtime exec'ing a plugin, or loading a
// conflist) sees the old file or the new one, never a part.
func writeAtomic(path string, data []byte, mode fs.FileMode) error {
	return writeAtomicFrom(path, bytes.NewReader(data), mode)
}

// copyAtomic streams the file src to path as writeAtomic does, so that a
// binary of any size costs a copy buffer, not its whole length in memory.
func copyAtomic(path, src string, mode fs.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open %s to copy to %s: %w", src, path, err)
	}
	defer f.Close()
	return writeAtomicFrom(path, f, mode)
}

// writeAtomicFrom is writeAtomic with the content read from r.
func writeAtomicFrom(path string, r io.Reader, mode fs.FileMode) error {
	dir, base := filepath.Split(path)
	tmp, err := os.CreateTemp(dir, "."+base+".village-tmp-")
	if err != nil {
		return fmt.Errorf("create temporary file for %s: %w", path, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	done = true
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// removeDurably removes path (absent is fine) and fsyncs its directory.
func removeDurably(path string) error {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func digest(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// fileDigest returns the sha256 and mode of path; exists is false when
// there is no such file.
func fileDigest(path string) (sum string, mode fs.FileMode, exists bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, false, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return "", fi.Mode(), true, fmt.Errorf("%s is not a regular file (%s); refusing to replace it", path, fi.Mode().Type())
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", 0, false, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), fi.Mode().Perm(), true, nil
}
