package validate

import (
	"log/slog"
	"net"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestLinkName(t *testing.T) {
	for name, ok := range map[string]bool{
		"eth0": true, "village0": true, "a": true, "123456789012345": true, "net-1_x.y": true, "é": true,
		"": false, "1234567890123456": false, ".": false, "..": false, "...": true,
		"a/b": false, "eth0:1": false, "a b": false, "a\tb": false, "a\nb": false, "eth0\x00x": false, "a\x7f": false, "a\x01": false, "a\xa0": false, "a\u00a0": false,
	} {
		if err := LinkName(name); (err == nil) != ok {
			t.Errorf("LinkName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

func TestMAC(t *testing.T) {
	for s, ok := range map[string]bool{
		"0a:58:0a:f4:01:05": true, "02-00-00-00-00-01": true, "0200.0000.0001": true,
		"": false, "01:00:5e:00:00:01": false, "ff:ff:ff:ff:ff:ff": false, "0a:58:0a:f4:01": false,
		"00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01": false, "zz:58:0a:f4:01:05": false,
	} {
		hw, err := MAC(s)
		if (err == nil) != ok {
			t.Errorf("MAC(%q) = %v, want ok %v", s, err, ok)
		}
		if ok && len(hw) != 6 {
			t.Errorf("MAC(%q) = %v", s, hw)
		}
	}
}

func TestMTU(t *testing.T) {
	for mtu, ok := range map[int]bool{0: true, 68: true, 1500: true, 9000: true, 65535: true, -1: false, 1: false, 67: false, 65536: false} {
		if err := MTU(mtu); (err == nil) != ok {
			t.Errorf("MTU(%d) = %v, want ok %v", mtu, err, ok)
		}
	}
}

func TestNodeName(t *testing.T) {
	for name, ok := range map[string]bool{
		"node-1": true, "n1.example.com": true, "a": true, "0": true, strings.Repeat("a", 253): true,
		"": false, strings.Repeat("a", 254): false, "Node1": false, "node_1": false, "-a": false, "a-": false,
		"a..b": false, ".a": false, "a.": false, "a/b": false, "a b": false, ".": false, "..": false, "a.-b": false,
	} {
		if err := NodeName(name); (err == nil) != ok {
			t.Errorf("NodeName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

func TestNamespaceName(t *testing.T) {
	for name, ok := range map[string]bool{
		"kube-system": true, "a": true, "0a": true, strings.Repeat("a", 63): true,
		"": false, strings.Repeat("a", 64): false, "a.b": false, "A": false, "-a": false, "a-": false, "a_b": false,
	} {
		if err := NamespaceName(name); (err == nil) != ok {
			t.Errorf("NamespaceName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

var dns1123LabelPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func FuzzNamespaceName(f *testing.F) {
	for _, s := range []string{"kube-system", "", "a.b", "-a", strings.Repeat("a", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) <= 63 && dns1123LabelPattern.MatchString(name)
		if got := NamespaceName(name) == nil; got != want {
			t.Fatalf("NamespaceName(%q) ok = %v, want %v", name, got, want)
		}
	})
}

func TestNetworkName(t *testing.T) {
	for name, ok := range map[string]bool{
		"village": true, "Net_1.a-b": true, "0": true, strings.Repeat("a", 200): true,
		"": false, strings.Repeat("a", 201): false, "-a": false, "_a": false, ".a": false, "a/b": false, "a b": false, "é": false, "..": false,
	} {
		if err := NetworkName(name); (err == nil) != ok {
			t.Errorf("NetworkName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

func TestContainerID(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc123": true, "A.b_c-d": true, strings.Repeat("f", 1024): true,
		"": false, strings.Repeat("f", 1025): false, "-a": false, "a/b": false, "a b": false,
	} {
		if err := ContainerID(id); (err == nil) != ok {
			t.Errorf("ContainerID(%q) = %v, want ok %v", id, err, ok)
		}
	}
}

func TestLogLevel(t *testing.T) {
	for s, want := range map[string]slog.Level{
		"": slog.LevelInfo, "info": slog.LevelInfo, "INFO": slog.LevelInfo, "debug": slog.LevelDebug,
		"warn": slog.LevelWarn, "warning": slog.LevelWarn, "Warning": slog.LevelWarn, "error": slog.LevelError,
	} {
		if got, err := LogLevel(s); err != nil || got != want {
			t.Errorf("LogLevel(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"trace", "fatal", "err", " info", "infox"} {
		if _, err := LogLevel(s); err == nil {
			t.Errorf("LogLevel(%q) accepted", s)
		}
	}
}

// The fuzz targets check each rule against an independent statement of its
// contract; `go test` runs their seed corpus.

func FuzzLinkName(f *testing.F) {
	for _, s := range []string{"eth0", "", ".", "..", "a/b", "a:b", "a b", "a\x00", "1234567890123456", "\xff\xfe", "a\xa0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) >= 1 && len(name) <= 15 && name != "." && name != ".." &&
			!strings.ContainsAny(name, "/:") && !strings.ContainsFunc(name, func(r rune) bool { return r < 0x21 || r == 0x7f }) &&
			!strings.Contains(name, "\xa0")
		if got := LinkName(name) == nil; got != want {
			t.Fatalf("LinkName(%q) ok = %v, want %v", name, got, want)
		}
	})
}

func FuzzMAC(f *testing.F) {
	for _, s := range []string{"0a:58:0a:f4:01:05", "01:00:5e:00:00:01", "", "0200.0000.0001", "00:00:00:00:00:00:00:01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hw, err := MAC(s)
		std, stdErr := net.ParseMAC(s)
		want := stdErr == nil && len(std) == 6 && std[0]&1 == 0
		if (err == nil) != want {
			t.Fatalf("MAC(%q) = %v, want ok %v", s, err, want)
		}
		if err == nil && hw.String() != std.String() {
			t.Fatalf("MAC(%q) = %v, want %v", s, hw, std)
		}
	})
}

func FuzzMTU(f *testing.F) {
	for _, n := range []int{0, -1, 67, 68, 1500, 65535, 65536} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int) {
		want := n == 0 || (n >= 68 && n <= 65535)
		if got := MTU(n) == nil; got != want {
			t.Fatalf("MTU(%d) ok = %v, want %v", n, got, want)
		}
	})
}

var dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func FuzzNodeName(f *testing.F) {
	for _, s := range []string{"node-1", "a.b.c", "", "A", "a..b", "-a", "a-", "a_b", strings.Repeat("a", 254)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) <= 253 && dns1123Subdomain.MatchString(name)
		if got := NodeName(name) == nil; got != want {
			t.Fatalf("NodeName(%q) ok = %v, want %v", name, got, want)
		}
	})
}

var cniNamePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

func FuzzNetworkName(f *testing.F) {
	for _, s := range []string{"village", "", "-a", "a/b", "a.b_c-d", "é", strings.Repeat("a", 201)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) <= 200 && cniNamePattern.MatchString(name)
		if got := NetworkName(name) == nil; got != want {
			t.Fatalf("NetworkName(%q) ok = %v, want %v", name, got, want)
		}
	})
}

func FuzzContainerID(f *testing.F) {
	for _, s := range []string{"abc", "", "-a", "a/b", strings.Repeat("f", 1025)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		want := len(id) <= 1024 && cniNamePattern.MatchString(id)
		if got := ContainerID(id) == nil; got != want {
			t.Fatalf("ContainerID(%q) ok = %v, want %v", id, got, want)
		}
	})
}

func FuzzLogLevel(f *testing.F) {
	for _, s := range []string{"", "info", "WARNING", "warn", "debug", "error", "trace"} {
		f.Add(s)
	}
	levels := map[string]slog.Level{"": slog.LevelInfo, "info": slog.LevelInfo, "debug": slog.LevelDebug,
		"warn": slog.LevelWarn, "warning": slog.LevelWarn, "error": slog.LevelError}
	f.Fuzz(func(t *testing.T, s string) {
		want, ok := levels[strings.ToLower(s)]
		got, err := LogLevel(s)
		if (err == nil) != ok || (ok && got != want) {
			t.Fatalf("LogLevel(%q) = %v, %v; want %v, ok %v", s, got, err, want, ok)
		}
		if err != nil && !utf8.ValidString(err.Error()) {
			t.Fatalf("LogLevel(%q): error is not UTF-8", s)
		}
	})
}

// The host's node name is its host name as kubelet registers it: lower case.
