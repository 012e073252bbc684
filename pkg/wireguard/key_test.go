package wireguard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/testenv"
)

func TestLoadOrCreateKey(t *testing.T) {
	testenv.RequireRoot(t) // ownership is checked against root
	good, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		prepare func(t *testing.T, path string) // nil: nothing there
		want    *wgtypes.Key                    // the key to load; nil with no err: a new one
		err     string                          // substring of the error
	}{
		{name: "missing file and directories are made"},
		{name: "existing key is loaded", want: &good, prepare: func(t *testing.T, p string) {
			write(t, p, good.String()+"\n", 0o600)
		}},
		{name: "key without newline", want: &good, prepare: func(t *testing.T, p string) {
			write(t, p, good.String(), 0o400)
		}},
		{name: "readable by others", err: "mode 0604", prepare: func(t *testing.T, p string) {
			write(t, p, good.String(), 0o604)
		}},
		{name: "readable by group", err: "mode 0640", prepare: func(t *testing.T, p string) {
			write(t, p, good.String(), 0o640)
		}},
		{name: "not owned by root", err: "owned by uid 1000, not root", prepare: func(t *testing.T, p string) {
			write(t, p, good.String(), 0o600)
			if err := os.Chown(p, 1000, 1000); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "garbage", err: "not a base64 WireGuard key", prepare: func(t *testing.T, p string) {
			write(t, p, "not a key\n", 0o600)
		}},
		{name: "empty file", err: "wireguard key file", prepare: func(t *testing.T, p string) {
			write(t, p, "", 0o600)
		}},
		{name: "symbolic link", err: "symbolic link", prepare: func(t *testing.T, p string) {
			target := filepath.Join(t.TempDir(), "real.key")
			write(t, target, good.String(), 0o600)
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "directory", err: "not a regular file", prepare: func(t *testing.T, p string) {
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "wireguard", "net1.key")
			var before []byte
			if tc.prepare != nil {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				tc.prepare(t, path)
				before, _ = os.ReadFile(path)
			}
			priv, pub, err := LoadOrCreateKey(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrKeyFile) {
					t.Fatalf("err = %v, want ErrKeyFile mentioning %q", err, tc.err)
				}
				if after, _ := os.ReadFile(path); string(after) != string(before) {
					t.Fatalf("refused file was changed: %q -> %q", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if pub != priv.PublicKey() || priv == (wgtypes.Key{}) {
				t.Fatalf("private %s public %s: not a pair", priv, pub)
			}
			if tc.want != nil {
				if priv != *tc.want {
					t.Fatalf("loaded %s, want %s", priv, *tc.want)
				}
				return
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("new key file mode %04o, want 0600", fi.Mode().Perm())
			}
			for _, d := range []string{filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
				if di, err := os.Stat(d); err != nil || di.Mode().Perm() != 0o700 {
					t.Errorf("directory %s: %v, mode %v, want 0700", d, err, di.Mode().Perm())
				}
			}
			entries, _ := os.ReadDir(filepath.Dir(path))
			if len(entries) != 1 {
				t.Errorf("key directory holds %d entries, want only the key (no temporary file)", len(entries))
			}
			got, err := os.ReadFile(path)
			if err != nil || strings.TrimSpace(string(got)) != priv.String() {
				t.Fatalf("file holds %q (%v), want the key %s", got, err, priv)
			}
		})
	}
}

// A node's key survives restarts: a second load (a new agent process
// reads the same file) returns the first call's key.
func TestLoadOrCreateKeySurvivesRestart(t *testing.T) {
	testenv.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "wg", "k.key")
	priv1, pub1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	priv2, pub2, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if priv1 != priv2 || pub1 != pub2 {
		t.Fatalf("second call returned another key: %s then %s", pub1, pub2)
	}
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // umask
		t.Fatal(err)
	}
}

// ReplaceKey puts a new key in place of the old one, root-only, and
// LoadOrCreateKey reads the new one; a missing directory is made.
func TestReplaceKey(t *testing.T) {
	testenv.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "sub", "node.key")
	old, _, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	next, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := ReplaceKey(path, next); err != nil {
		t.Fatal(err)
	}
	got, pub, err := LoadOrCreateKey(path)
	if err != nil || got != next || pub != next.PublicKey() || got == old {
		t.Fatalf("after ReplaceKey: %v (%v), want the new key", got, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("the key directory holds %d files, want the key only", len(entries))
	}
	if err := ReplaceKey(filepath.Join(t.TempDir(), "fresh", "node.key"), next); err != nil {
		t.Fatalf("into a missing directory: %v", err)
	}
}
