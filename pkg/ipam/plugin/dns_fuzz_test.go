package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseResolvConf fuzzes the resolv.conf-style file named by
// ipam.resolvConf: no panic, and nothing in the result carries whitespace
// or a line break into the runtime's JSON.
func FuzzParseResolvConf(f *testing.F) {
	for _, s := range []string{
		"nameserver 10.0.0.10\nsearch a.svc b.svc\noptions ndots:5\ndomain cluster.local\n",
		"# comment\n;comment\nnameserver\n\n", "", "\x00\xff\r\n", "search " + strings.Repeat("x ", 3000), strings.Repeat("a", 70000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "resolv.conf")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		dns, err := parseResolvConf(path)
		if err != nil {
			if !strings.Contains(err.Error(), "DNS") {
				t.Fatalf("error %v does not say what it was reading", err)
			}
			return
		}
		all := append(append(append([]string{dns.Domain}, dns.Nameservers...), dns.Search...), dns.Options...)
		for _, v := range all {
			if strings.ContainsAny(v, " \t\n") {
				t.Fatalf("value %q from %q carries whitespace", v, b)
			}
		}
	})
}
