package members

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
)

// ParseKey decodes the gossip key as users write it: the standard base64
// of 16, 24 or 32 random bytes (AES-128, -192 or -256), surrounding white
// space ignored (a Secret made with `head -c 32 /dev/urandom | base64`).
func ParseKey(text []byte) ([]byte, error) {
	t := bytes.TrimSpace(text)
	key := make([]byte, base64.StdEncoding.DecodedLen(len(t)))
	n, err := base64.StdEncoding.Decode(key, t)
	if err != nil {
		return nil, fmt.Errorf("members: gossip key: not base64: %w", err)
	}
	key = key[:n]
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("members: gossip key: %d bytes, want 16, 24 or 32 (the base64 of `head -c 32 /dev/urandom`)", len(key))
}

// ReadKeyFile reads and parses the gossip key in path.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("members: gossip key: %w", err)
	}
	key, err := ParseKey(b)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return key, nil
}
