package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/subnetfile"
)

func conf(ipam string) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"net1","type":"village","ipam":` + ipam + `}`)
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse(conf(`{"type":"village-ipam","subnet":"10.1.0.0/24"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != store.DefaultDataDir || c.Store.Type != StoreDisk || c.Name != "net1" {
		t.Fatalf("defaults: %+v", c)
	}
	r := c.RangeSets[0][0]
	want := Range{Subnet: netip.MustParsePrefix("10.1.0.0/24"), RangeStart: netip.MustParseAddr("10.1.0.1"),
		RangeEnd: netip.MustParseAddr("10.1.0.254"), Gateway: netip.MustParseAddr("10.1.0.1")}
	if r != want {
		t.Fatalf("range = %+v, want %+v", r, want)
	}
	c, err = Parse(conf(`{"ranges":[[{"subnet":"fd00::/120"}]]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RangeSets[0][0].RangeEnd.String(); got != "fd00::ff" {
		t.Fatalf("IPv6 rangeEnd = %s, want fd00::ff (no broadcast in IPv6)", got)
	}
}

func TestParseOrderAndRequested(t *testing.T) {
	in := []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.9.0.0/24",
		"ranges":[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20","gateway":"10.1.0.254"},
		           {"subnet":"10.2.0.0/24"}],[{"subnet":"fd00::/64"}]],
		"routes":[{"dst":"0.0.0.0/0"}],"dataDir":"/tmp/x","resolvConf":"/etc/r",
		"store":{"type":"etcd","endpoints":["https://127.0.0.1:2379"],"certFile":"c","keyFile":"k"}},
		"runtimeConfig":{"ips":["10.1.0.12/24","fd00::5"],"ipRanges":[[{"subnet":"10.3.0.0/24"}]]},
		"args":{"cni":{"ips":["10.2.0.7"]}},
		"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}`)
	c, err := Parse(in, "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.9.0.5")
	if err != nil {
		t.Fatal(err)
	}
	var firsts []string
	for _, s := range c.RangeSets {
		firsts = append(firsts, s[0].Subnet.String())
	}
	if got := strings.Join(firsts, " "); got != "10.3.0.0/24 10.9.0.0/24 10.1.0.0/24 fd00::/64" {
		t.Fatalf("range set order %q", got)
	}
	var req []string
	for _, a := range c.RequestedIPs {
		req = append(req, a.String())
	}
	if got := strings.Join(req, " "); got != "10.9.0.5 10.2.0.7 10.1.0.12 fd00::5" {
		t.Fatalf("requested %q", got)
	}
	if c.Store.Prefix != store.DefaultEtcdPrefix || len(c.Routes) != 1 || c.DataDir != "/tmp/x" || c.ResolvConf != "/etc/r" {
		t.Fatalf("config %+v", c)
	}
	if len(c.ValidAttachments) != 1 || c.ValidAttachments[0].IfName != "eth0" {
		t.Fatalf("attachments %+v", c.ValidAttachments)
	}
	in = []byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"subnet":"10.9.0.0/24"},
		"cni.dev/valid-attachments":[],"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}`)
	if c, err = Parse(in, ""); err != nil || c.ValidAttachments == nil || len(c.ValidAttachments) != 0 {
		t.Fatalf("valid-attachments [] must win over attachments: %+v %v", c, err)
	}
}

func TestParseErrors(t *testing.T) {
	// "no ranges" looks for the subnet villaged publishes: point it at an
	// empty directory so the machine's own /run/village cannot answer.
	t.Setenv(nodelocal.RunDirEnv, t.TempDir())
	cases := []struct {
		name, in, args, field, msg string
	}{
		{"not json", `{`, "", "", "decode"},
		{"no name", `{"ipam":{"subnet":"10.0.0.0/24"}}`, "", "name", "missing"},
		{"bad name", `{"name":"../x","ipam":{"subnet":"10.0.0.0/24"}}`, "", "name", "letter or digit"},
		{"no ipam", `{"name":"n"}`, "", "ipam", "missing"},
		{"no ranges", `{"name":"n","ipam":{}}`, "", "ipam.ranges", "no address range"},
		{"start without subnet", `{"name":"n","ipam":{"rangeStart":"10.0.0.1"}}`, "", "ipam.subnet", "missing"},
		{"bad cidr", `{"name":"n","ipam":{"subnet":"10.0.0.0/33"}}`, "", "ipam.subnet", "not a CIDR"},
		{"bad cidr in ranges", `{"name":"n","ipam":{"ranges":[[{"subnet":"x"}]]}}`, "", "ipam.ranges[0][0].subnet", "not a CIDR"},
		{"/31", `{"name":"n","ipam":{"subnet":"10.0.0.0/31"}}`, "", "ipam.subnet", "too small"},
		{"/32", `{"name":"n","ipam":{"subnet":"10.0.0.0/32"}}`, "", "ipam.subnet", "too small"},
		{"/127", `{"name":"n","ipam":{"subnet":"fd00::/127"}}`, "", "ipam.subnet", "too small"},
		{"/128", `{"name":"n","ipam":{"subnet":"fd00::/128"}}`, "", "ipam.subnet", "too small"},
		{"host bits", `{"name":"n","ipam":{"subnet":"10.0.0.5/24"}}`, "", "ipam.subnet", "host bits"},
		{"zone in subnet", `{"name":"n","ipam":{"subnet":"fe80::%eth0/64"}}`, "", "ipam.subnet", "not a CIDR"},
		{"zone in gateway", `{"name":"n","ipam":{"subnet":"fe80::/64","gateway":"fe80::1%eth0"}}`, "", "ipam.gateway", "zone"},
		{"mapped subnet", `{"name":"n","ipam":{"subnet":"::ffff:10.0.0.0/120"}}`, "", "ipam.subnet", "IPv4-mapped"},
		{"start outside", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.1"}}`, "", "ipam.rangeStart", "not in subnet"},
		{"end outside", `{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.1.1"}]]}}`, "", "ipam.ranges[0][0].rangeEnd", "not in subnet"},
		{"gateway outside", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","gateway":"192.168.0.1"}}`, "", "ipam.gateway", "not in subnet"},
		{"gateway other family", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","gateway":"fd00::1"}}`, "", "ipam.gateway", "not in subnet"},
		{"sticky not a duration", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","sticky":"5"}}`, "", "ipam.sticky", "duration"},
		{"sticky too short", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","sticky":"10ms"}}`, "", "ipam.sticky", "from 1s"},
		{"sticky too long", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","sticky":"200h"}}`, "", "ipam.sticky", "to 168h"},
		{"pod name with _", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}`, "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a_b", "CNI_ARGS", "K8S_POD_NAME"},
		{"namespace with .", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}`, "K8S_POD_NAMESPACE=a.b;K8S_POD_NAME=db-0", "CNI_ARGS", "K8S_POD_NAMESPACE"},
		{"start after end", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.9","rangeEnd":"10.0.0.8"}}`, "", "ipam.rangeStart", "after rangeEnd"},
		{"bad ip", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.300"}}`, "", "ipam.rangeStart", "not an IP"},
		{"empty set", `{"name":"n","ipam":{"ranges":[[]]}}`, "", "ipam.ranges[0]", "empty range set"},
		{"mixed families", `{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]}}`, "", "ipam.ranges[0][1].subnet", "mixes address families"},
		{"overlap in set", `{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.0.0/16"}]]}}`, "", "ipam.ranges[0][1]", "overlaps"},
		{"overlap across sets", `{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.0/25"}]]}}`, "", "ipam.ranges[1]", "overlaps"},
		{"legacy overlaps ranges", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", "ipam.ranges[0]", "overlaps"},
		{"two v4 in 0.2.0", `{"cniVersion":"0.2.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]}}`, "", "cniVersion", "one address per family"},
		{"unknown store", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"consul"}}}`, "", "ipam.store.type", "unknown store type"},
		{"etcd no endpoints", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"etcd"}}}`, "", "ipam.store.endpoints", "missing"},
		{"etcd bad endpoint", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"etcd","endpoints":["127.0.0.1:2379"]}}}`, "", "ipam.store.endpoints[0]", "not an http"},
		{"etcd cert without key", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"etcd","endpoints":["http://a:1"],"certFile":"c"}}}`, "", "ipam.store.certFile", "together"},
		{"etcd bad prefix", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"etcd","endpoints":["http://a:1"],"prefix":"x"}}}`, "", "ipam.store.prefix", "start with"},
		{"disk with endpoints", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"endpoints":["http://a:1"]}}}`, "", "ipam.store.endpoints", "only used"},
		{"kubernetes with endpoints", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"kubernetes","endpoints":["http://a:1"]}}}`, "", "ipam.store", "not etcd's"},
		{"bad nodeName", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"etcd","endpoints":["http://e:2379"],"nodeName":"Node_1"}}}`, "", "ipam.store.nodeName", "DNS-1123 subdomain"},
		{"long name", `{"name":"` + strings.Repeat("n", 201) + `","ipam":{"subnet":"10.0.0.0/24"}}`, "", "name", "200"},
		{"kubernetes bad namespace", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"kubernetes","namespace":"Kube_System"}}}`, "", "ipam.store.namespace", "DNS-1123 label"},
		{"disk with kubeconfig", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"kubeconfig":"/k"}}}`, "", "ipam.store", "only used with store type"},
		{"etcd with namespace", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","store":{"type":"etcd","endpoints":["http://a:1"],"namespace":"x"}}}`, "", "ipam.store", "only used with store type"},
		{"bad runtime ip", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"},"runtimeConfig":{"ips":["nope"]}}`, "", "runtimeConfig.ips[0]", "not an IP"},
		{"bad args ip", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"},"args":{"cni":{"ips":["1.2.3.4/99"]}}}`, "", "args.cni.ips[0]", "not an IP"},
		{"bad CNI_ARGS ip", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}`, "IP=x", "CNI_ARGS", "not an IP"},
		{"unknown CNI_ARGS", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}`, "FOO=1", "CNI_ARGS", "unknown"},
		{"null route", `{"name":"n","ipam":{"subnet":"10.0.0.0/24","routes":[null]}}`, "", "ipam.routes[0]", "null"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), tc.args)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
			if tc.field == "" {
				if !errors.Is(err, ErrDecode) {
					t.Errorf("error %q is not ErrDecode", err)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Errorf("error %q: field %v, want %q", err, ce, tc.field)
			}
		})
	}
}

func TestRangeHelpers(t *testing.T) {
	c, err := Parse(conf(`{"ranges":[[{"subnet":"10.1.0.0/29","rangeStart":"10.1.0.0","rangeEnd":"10.1.0.7"}],[{"subnet":"fd00::/126"}]]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	r4, r6 := c.RangeSets[0][0], c.RangeSets[1][0]
	for _, tc := range []struct {
		r     Range
		a     string
		alloc bool
	}{
		{r4, "10.1.0.0", false}, // network
		{r4, "10.1.0.1", false}, // gateway
		{r4, "10.1.0.2", true},
		{r4, "10.1.0.7", false}, // broadcast
		{r4, "10.1.0.8", false}, // outside
		{r4, "fd00::2", false},  // other family
		{r6, "fd00::", false},
		{r6, "fd00::1", false},
		{r6, "fd00::2", true},
		{r6, "fd00::3", true}, // IPv6 has no broadcast
	} {
		if got := tc.r.Allocatable(netip.MustParseAddr(tc.a)); got != tc.alloc {
			t.Errorf("%s.Allocatable(%s) = %v", tc.r, tc.a, got)
		}
	}
	if c.RangeSets[1].Family() != 6 || c.RangeSets[0].Family() != 4 {
		t.Error("Family")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"0.2.0","name":"n","ipam":{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.5","rangeEnd":"10.0.0.9","gateway":"10.0.0.1"}}`), "IP=10.0.0.6")
	f.Add([]byte(`{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64","gateway":"fd00::1"}]],"store":{"type":"etcd","endpoints":["https://x:1"]}},"runtimeConfig":{"ips":["fd00::4"]}}`), "")
	f.Add([]byte(`{"name":"n","ipam":{"subnet":"::/0"},"args":{"cni":{"ips":["::ffff:1.2.3.4"]}}}`), "IgnoreUnknown=1;A=b")
	f.Fuzz(func(t *testing.T, in []byte, args string) {
		c, err := Parse(in, args)
		if err != nil {
			return
		}
		for _, s := range c.RangeSets {
			for _, r := range s {
				if !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) || r.RangeStart.Compare(r.RangeEnd) > 0 {
					t.Fatalf("accepted invalid range %+v", r)
				}
			}
		}
	})
}

func TestGCListNullIsEmpty(t *testing.T) {
	base := `{"cniVersion":"1.1.0","name":"n","ipam":{"type":"village-ipam","subnet":"10.1.0.0/24"}%s}`
	for _, c := range []struct {
		extra string
		want  []Attachment
	}{
		{``, nil},
		{`,"cni.dev/valid-attachments":null`, []Attachment{}},
		{`,"cni.dev/valid-attachments":[]`, []Attachment{}},
		{`,"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]`, []Attachment{{ContainerID: "a", IfName: "eth0"}}},
		{`,"cni.dev/valid-attachments":null,"cni.dev/attachments":null`, []Attachment{}},
	} {
		cfg, err := Parse([]byte(fmt.Sprintf(base, c.extra)), "")
		if err != nil {
			t.Fatalf("%s: %v", c.extra, err)
		}
		if (cfg.ValidAttachments == nil) != (c.want == nil) || len(cfg.ValidAttachments) != len(c.want) {
			t.Fatalf("%s: got %#v, want %#v", c.extra, cfg.ValidAttachments, c.want)
		}
		for i := range c.want {
			if cfg.ValidAttachments[i] != c.want[i] {
				t.Fatalf("%s: got %#v", c.extra, cfg.ValidAttachments)
			}
		}
	}
}

func TestRangeFromVillagedSubnetFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(nodelocal.RunDirEnv, dir)
	in := `{"name":"ovl","ipam":{"type":"village-ipam"}}`
	_, err := Parse([]byte(in), "")
	if !errors.Is(err, ErrNotLeased) || !strings.Contains(err.Error(), "is `villaged run` running?") ||
		!strings.Contains(err.Error(), filepath.Join(dir, "ovl", "subnet")) {
		t.Fatalf("no file: %v, want ErrNotLeased naming the file", err)
	}
	if got := subnetfile.Path("", "ovl"); got != filepath.Join(dir, "ovl", "subnet") {
		t.Fatalf("subnetfile.Path = %s", got)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "ovl"), 0o755))
	must(os.WriteFile(subnetfile.Path("", "ovl"), []byte("# leased by villaged\n10.60.3.0/24\nfd60:0:0:3::/64\n"), 0o644))
	c, err := Parse([]byte(in), "")
	must(err)
	if len(c.RangeSets) != 2 || c.RangeSets[0][0].Subnet.String() != "10.60.3.0/24" || c.RangeSets[1][0].Gateway.String() != "fd60:0:0:3::1" {
		t.Fatalf("range sets from the file: %+v", c.RangeSets)
	}
	// ipam.subnetFile overrides the path; ranges in the config win over any file.
	other := filepath.Join(dir, "other")
	must(os.WriteFile(other, []byte("10.70.0.0/24\n"), 0o644))
	c, err = Parse([]byte(`{"name":"ovl","ipam":{"subnetFile":`+strconv.Quote(other)+`}}`), "")
	must(err)
	if len(c.RangeSets) != 1 || c.RangeSets[0][0].Subnet.String() != "10.70.0.0/24" {
		t.Fatalf("subnetFile: %+v", c.RangeSets)
	}
	c, err = Parse([]byte(`{"name":"ovl","ipam":{"subnet":"10.80.0.0/24"}}`), "")
	must(err)
	if len(c.RangeSets) != 1 || c.RangeSets[0][0].Subnet.String() != "10.80.0.0/24" {
		t.Fatalf("config subnet must win: %+v", c.RangeSets)
	}
	must(os.WriteFile(other, []byte("nonsense\n"), 0o644))
	_, err = Parse([]byte(`{"name":"ovl","ipam":{"subnetFile":`+strconv.Quote(other)+`}}`), "")
	if err == nil || errors.Is(err, ErrNotLeased) || !strings.Contains(err.Error(), other) {
		t.Fatalf("bad file: %v, want an error naming %s", err, other)
	}
}

func TestParseStaticReadsNoLease(t *testing.T) {
	t.Setenv(nodelocal.RunDirEnv, t.TempDir()) // no file there
	c, err := ParseStatic([]byte(`{"name":"ovl","ipam":{"type":"village-ipam","subnetFile":"/elsewhere/s"}}`))
	if err != nil || len(c.RangeSets) != 0 || c.SubnetFile != "/elsewhere/s" || c.DataDir != store.DefaultDataDir {
		t.Fatalf("ParseStatic without ranges = %+v, %v", c, err)
	}
	c, err = ParseStatic([]byte(`{"name":"ovl","ipam":{"subnet":"10.1.2.0/24","ranges":[[{"subnet":"fd00::/64"}]]}}`))
	if err != nil || len(c.RangeSets) != 2 || c.RangeSets[0][0].Subnet.String() != "10.1.2.0/24" {
		t.Fatalf("ParseStatic with ranges = %+v, %v", c, err)
	}
	if _, err := ParseStatic([]byte(`{"name":"ovl","ipam":{"subnet":"10.1.2.5/24"}}`)); err == nil {
		t.Fatal("ParseStatic accepted a subnet with host bits")
	}
}

// TestParseStore: the store alone, as Parse reads it (defaults filled,
// the same refusals), for villaged's reclaim of a LAN pool.
func TestParseStore(t *testing.T) {
	for _, c := range []struct {
		block, wantType, wantPrefix, errIn string
	}{
		{`{"type":"village-ipam","subnet":"10.0.0.0/24"}`, StoreDisk, "", ""},
		{`{"store":{"type":"etcd","endpoints":["http://10.0.0.1:2379"]}}`, StoreEtcd, store.DefaultEtcdPrefix, ""},
		{`{"store":{"type":"etcd","endpoints":["http://10.0.0.1:2379"],"prefix":"/lan"}}`, StoreEtcd, "/lan", ""},
		{`{"store":{"type":"etcd","endpoints":["10.0.0.1:2379"]}}`, "", "", "ipam.store.endpoints[0]"},
		{`{"store":{"type":"etcd"}}`, "", "", "ipam.store.endpoints"},
		{`{"store":{"type":"kubernetes","prefix":"/x"}}`, "", "", "ipam.store"},
		{`{"store":[]}`, "", "", "decod"},
	} {
		got, err := ParseStore([]byte(c.block))
		if c.errIn != "" {
			if err == nil || !strings.Contains(err.Error(), c.errIn) {
				t.Errorf("%s: %v, want an error naming %q", c.block, err, c.errIn)
			}
			continue
		}
		if err != nil || got.Type != c.wantType || got.Prefix != c.wantPrefix {
			t.Errorf("%s: %+v %v, want type %q prefix %q", c.block, got, err, c.wantType, c.wantPrefix)
		}
		// The same block through Parse gives the same store.
		full := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","ipam":%s}`, strings.Replace(c.block, `{"`, `{"subnet":"10.0.0.0/24","`, 1))
		if cfg, err := Parse([]byte(full), ""); err != nil || fmt.Sprint(cfg.Store) != fmt.Sprint(got) {
			t.Errorf("%s: Parse gives %+v (%v), ParseStore %+v", c.block, cfg.Store, err, got)
		}
	}
}

// TestParseSticky: ipam.sticky and the pod's names from CNI_ARGS.
func TestParseSticky(t *testing.T) {
	c, err := Parse([]byte(`{"name":"n","ipam":{"subnet":"10.0.0.0/24","sticky":"5m"}}`), "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=db-0;K8S_POD_UID=u")
	if err != nil {
		t.Fatal(err)
	}
	if c.Sticky != 5*time.Minute || c.PodNamespace != "shop" || c.PodName != "db-0" {
		t.Fatalf("sticky %v pod %q/%q", c.Sticky, c.PodNamespace, c.PodName)
	}
	if c, err = Parse([]byte(`{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}`), ""); err != nil || c.Sticky != 0 {
		t.Fatalf("no sticky: %v %v", c, err)
	}
}
