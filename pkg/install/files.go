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

	"github.com/village-cni/village/pkg/nodelocal"
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

// writeAtomicFrom is writeAtomic with the content read from r
// (nodelocal.WriteFrom).
func writeAtomicFrom(path string, r io.Reader, mode fs.FileMode) error {
	return nodelocal.WriteFrom(path, r, mode)
}

// removeDurably removes path (absent is fine) and fsyncs its directory.
func removeDurably(path string) error {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nodelocal.SyncDir(filepath.Dir(path))
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
