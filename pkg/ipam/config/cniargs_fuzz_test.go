package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/nodelocal"
)

// checkParseError asserts Parse's error contract: a field error naming the
// key, a decode error, or "not leased yet".
func checkParseError(t *testing.T, err error) {
	t.Helper()
	var fe *Error
	if !errors.As(err, &fe) && !errors.Is(err, ErrDecode) && !errors.Is(err, ErrNotLeased) {
		t.Fatalf("error %v (%T) is neither a field error nor a decode error", err, err)
	}
	if fe != nil && fe.Field == "" {
		t.Fatalf("field error %v names no field", err)
	}
}

// checkAccepted asserts what every accepted config guarantees the store and
// the allocator.
func checkAccepted(t *testing.T, c *Config) {
	t.Helper()
	if validateName(c.Name) != nil || strings.ContainsAny(c.Name, "/\x00") || c.Name == "." || c.Name == ".." {
		t.Fatalf("accepted network name %q", c.Name)
	}
	if !filepath.IsAbs(c.DataDir) {
		t.Fatalf("accepted relative dataDir %q", c.DataDir)
	}
	for _, a := range c.RequestedIPs {
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			t.Fatalf("accepted requested IP %v", a)
		}
	}
	for i, s := range c.RangeSets {
		for _, r := range s {
			if r.Subnet.Addr().Zone() != "" || r.RangeStart.Zone() != "" || r.RangeEnd.Zone() != "" || r.Gateway.Zone() != "" {
				t.Fatalf("accepted a zone in %+v", r)
			}
			if !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) || r.RangeStart.Compare(r.RangeEnd) > 0 {
				t.Fatalf("accepted range %+v", r)
			}
		}
		for j := i + 1; j < len(c.RangeSets); j++ {
			if overlapsSet(s, c.RangeSets[j]) {
				t.Fatalf("accepted overlapping range sets %d and %d", i, j)
			}
		}
	}
}

// FuzzParseCNIArgs fuzzes CNI_ARGS (IP=, IgnoreUnknown=, K8S_*) against a
// good dual-stack config: the environment is the runtime's, byte for byte.
func FuzzParseCNIArgs(f *testing.F) {
	for _, s := range []string{
		"", "IP=10.0.0.6", "IP=10.0.0.6/24", "IP=fd00::6", "IP=fd00::6%eth0", "IP=::ffff:10.0.0.6",
		"IgnoreUnknown=1;K8S_POD_NAME=a;IP=10.0.0.7", "IP=", "IP=10.0.0.6;IP=10.0.0.7", "FOO=bar", "garbage", ";=;",
		"IgnoreUnknown=true;=", "IP=10.0.0.300", "IP=10.0.0.6/99",
	} {
		f.Add(s)
	}
	stdin := []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"type":"village-ipam","dataDir":"/d","ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}}`)
	f.Fuzz(func(t *testing.T, args string) {
		c, err := Parse(stdin, args)
		if err != nil {
			checkParseError(t, err)
			return
		}
		checkAccepted(t, c)
	})
}

// FuzzParseConfig is FuzzParse with the full contract: errors name their
// field, and accepted configs are safe for the store (name, dataDir) and the
// allocator (zone-free, ordered, non-overlapping ranges).
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"0.2.0","name":"n","ipam":{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.5","rangeEnd":"10.0.0.9","gateway":"10.0.0.1"}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64","gateway":"fd00::1"}]],"store":{"type":"etcd","endpoints":["https://x:1"]}},"runtimeConfig":{"ips":["fd00::4"]}}`,
		`{"name":"n","ipam":{"subnet":"::/0"},"args":{"cni":{"ips":["::ffff:1.2.3.4"]}}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.128/25"}]]}}`,
		`{"name":"n","ipam":{"subnet":"fe80::%eth0/64"}}`,
		`{"name":"../x","ipam":{"subnet":"10.0.0.0/24"}}`,
		`{"name":"n","ipam":{"subnet":"10.0.0.0/24","dataDir":"rel"}}`,
		`{"name":"n","ipam":{"subnet":"10.0.0.0/24","routes":[null]}}`,
		`{"name":"n","ipam":{"subnetFile":"/nonexistent/x"}}`,
		`{"name":"n","ipam":{"subnet":"10.0.0.0/24"},"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Setenv(nodelocal.RunDirEnv, f.TempDir())
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := Parse(in, "")
		if err != nil {
			checkParseError(t, err)
			return
		}
		checkAccepted(t, c)
	})
}
