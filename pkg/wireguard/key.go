package wireguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/nodelocal"
)

// ErrKeyFile is wrapped by every error about a key file that exists but
// cannot be trusted or read as a key (never overwritten).
var ErrKeyFile = errors.New("wireguard key file")

// LoadOrCreateKey returns the private key stored at path and its public
// key. When path does not exist it generates a key and writes it there
// (missing directories are made 0700, the file 0600: written to a
// temporary file in the same directory, synced, then hard-linked into
// place, so a crash leaves either no key or a whole one, and of two
// processes racing the first key linked wins). A file that exists is used only
// when it is a regular file (not a symbolic link) owned by root with no
// permission for group or others, and holds one base64 key (the format of
// `wg genkey`); anything else is an error wrapping [ErrKeyFile], and the file
// is left as it is.
func LoadOrCreateKey(path string) (private, public wgtypes.Key, err error) {
	if path == "" {
		return private, public, fmt.Errorf("%w: no path given", ErrKeyFile)
	}
	private, err = loadKey(path)
	if errors.Is(err, os.ErrNotExist) {
		private, err = createKey(path)
	}
	if err != nil {
		return wgtypes.Key{}, wgtypes.Key{}, err
	}
	return private, private.PublicKey(), nil
}

// LoadKey is LoadOrCreateKey without the create: a missing file is an
// error wrapping os.ErrNotExist. For read-only callers (a status command).
func LoadKey(path string) (private, public wgtypes.Key, err error) {
	private, err = loadKey(path)
	if err != nil {
		return wgtypes.Key{}, wgtypes.Key{}, err
	}
	return private, private.PublicKey(), nil
}

func loadKey(path string) (wgtypes.Key, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ELOOP) {
		return wgtypes.Key{}, fmt.Errorf("%w %s: is a symbolic link", ErrKeyFile, path)
	}
	if err != nil {
		return wgtypes.Key{}, err // ErrNotExist included: the caller creates it
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return wgtypes.Key{}, err
	}
	if !fi.Mode().IsRegular() {
		return wgtypes.Key{}, fmt.Errorf("%w %s: not a regular file (%s)", ErrKeyFile, path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return wgtypes.Key{}, fmt.Errorf("%w %s: mode %04o lets group or others read it; it must be 0600 (chmod 600 %s)", ErrKeyFile, path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
		owner := "unknown"
		if ok {
			owner = fmt.Sprint(st.Uid)
		}
		return wgtypes.Key{}, fmt.Errorf("%w %s: owned by uid %s, not root", ErrKeyFile, path, owner)
	}
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil && n == 0 {
		return wgtypes.Key{}, fmt.Errorf("%w %s: %v", ErrKeyFile, path, err)
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("%w %s: not a base64 WireGuard key: %v", ErrKeyFile, path, err)
	}
	return k, nil
}

func createKey(path string) (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generating a WireGuard key: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("making the key directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("writing the key: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename: nothing to remove
	err = tmp.Chmod(0o600)      // CreateTemp makes it 0600 already; umask-proof
	if err == nil {
		_, err = tmp.WriteString(k.String() + "\n")
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Link, not rename: a key another process wrote meanwhile wins
		// and is never replaced.
		err = os.Link(tmp.Name(), path)
		if errors.Is(err, os.ErrExist) {
			return loadKey(path)
		}
	}
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("writing the key to %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return k, nil
}

// ReplaceKey writes private over the key file at path, for a key rotation,
// atomically (nodelocal.WriteFile: a temporary file in the same directory,
// 0600, synced, renamed over path), so a crash leaves the old key or the
// new one, whole. The directory is made 0700 when missing.
func ReplaceKey(path string, private wgtypes.Key) error {
	if path == "" {
		return fmt.Errorf("%w: no path given", ErrKeyFile)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("making the key directory of %s: %w", path, err)
	}
	if err := nodelocal.WriteFile(path, []byte(private.String()+"\n"), 0o600); err != nil {
		return fmt.Errorf("wireguard key: %w", err)
	}
	return nil
}
