package members_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/lansvc/members"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       int    // key length, 0 for an error
		err        string // part of the error
	}{
		{"aes-256 from urandom | base64", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n", 32, ""},
		{"aes-128", "MDEyMzQ1Njc4OWFiY2RlZg==", 16, ""},
		{"aes-192, spaces around", "  MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3 \n", 24, ""},
		{"empty", "", 0, "0 bytes"},
		{"white space only", " \n", 0, "0 bytes"},
		{"too short", "MDEyMzQ1Njc=", 0, "8 bytes"},
		{"not base64", "not a key!", 0, "not base64"},
		// 32 characters of base64's alphabet decode to 24 bytes: a key,
		// the same one on every node that has the text.
		{"32 characters taken as base64", "0123456789abcdef0123456789abcdef", 24, ""},
		{"33 bytes", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYw", 0, "33 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, err := members.ParseKey([]byte(tc.text))
			switch {
			case tc.want == 0 && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("ParseKey(%q) = %x, %v; want an error with %q", tc.text, key, err, tc.err)
			case tc.want != 0 && (err != nil || len(key) != tc.want):
				t.Fatalf("ParseKey(%q) = %d bytes, %v; want %d bytes", tc.text, len(key), err, tc.want)
			}
		})
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	if err := os.WriteFile(good, []byte("MDEyMzQ1Njc4OWFiY2RlZg==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if key, err := members.ReadKeyFile(good); err != nil || !bytes.Equal(key, []byte("0123456789abcdef")) {
		t.Fatalf("ReadKeyFile(%s) = %q, %v", good, key, err)
	}
	missing := filepath.Join(dir, "missing")
	if _, err := members.ReadKeyFile(missing); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadKeyFile(%s): %v, want a not-exist error", missing, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := members.ReadKeyFile(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("ReadKeyFile(%s): %v, want an error naming the file", bad, err)
	}
}

// FuzzParseKey: any text either gives a key of an AES size or an error.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"MDEyMzQ1Njc4OWFiY2RlZg==", "", "====", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		key, err := members.ParseKey(text)
		if err == nil && len(key) != 16 && len(key) != 24 && len(key) != 32 {
			t.Fatalf("ParseKey(%q) = %d bytes without an error", text, len(key))
		}
	})
}
