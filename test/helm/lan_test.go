package helm

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/village-cni/village/pkg/install"
	"github.com/village-cni/village/pkg/netconf"
)

// villageEntry renders the chart's conflist template as villaged install
// does on a node and parses its village entry with Village's own parser;
// raw is the entry's JSON object.
func villageEntry(t *testing.T, docs []map[string]any) (nc *netconf.NetConf, raw map[string]any) {
	t.Helper()
	return villageEntryWith(t, docs, nil)
}

// villageEntryWith is villageEntry with more of the install container's
// variables set (BACKEND, ...).
func villageEntryWith(t *testing.T, docs []map[string]any, more map[string]string) (nc *netconf.NetConf, raw map[string]any) {
	t.Helper()
	vars := map[string]string{"NODE_NAME": "node-1", "DEFAULT_IFACE": "eth0"}
	maps.Copy(vars, more)
	out, err := install.Render([]byte(conflistTemplate(t, docs)), func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatalf("render the conflist template: %v", err)
	}
	var list struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(out, &list); err != nil || len(list.Plugins) == 0 {
		t.Fatalf("conflist (%v):\n%s", err, out)
	}
	m := map[string]any{}
	raw = map[string]any{}
	if err := json.Unmarshal(list.Plugins[0], &raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(list.Plugins[0], &m); err != nil {
		t.Fatal(err)
	}
	m["name"], m["cniVersion"] = list.Name, list.CNIVersion
	b, _ := json.Marshal(m)
	nc, err = netconf.Parse(b, "")
	if err != nil {
		t.Fatalf("the village entry is rejected by netconf.Parse: %v\n%s", err, out)
	}
	return nc, raw
}

// TestLANValues: the lan section becomes a "macvlan" section Village
// accepts, with a village-ipam pool shared as Leases or the LAN's DHCP; DHCP
// (and only DHCP) grants the agent what it needs to be the pods' DHCP client.
func TestLANValues(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lan      map[string]any
		ipamType string
		dhcp     bool
	}{
		{"pool", map[string]any{"enabled": true, "subnet": "192.168.50.0/24", "rangeStart": "192.168.50.210",
			"rangeEnd": "192.168.50.239", "gateway": "192.168.50.1"}, "village-ipam", false},
		{"dhcp", map[string]any{"enabled": true, "addresses": "dhcp", "master": "enp3s0", "pods": "all",
			"subnet": "192.168.50.0/24", "rangeStart": "192.168.50.100", "rangeEnd": "192.168.50.199"}, "dhcp", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs := render(t, nil, map[string]any{"lan": tc.lan, "backend": "vxlan", "networkPolicy": false})
			nc, raw := villageEntry(t, docs)
			if nc.LAN == nil || nc.LAN.IPAMType != tc.ipamType || len(nc.LAN.Ranges) != 1 {
				t.Fatalf("LAN section %+v, want ipam type %s with one range", nc.LAN, tc.ipamType)
			}
			if r := nc.LAN.Ranges[0]; r.Start.String() != tc.lan["rangeStart"] || r.End.String() != tc.lan["rangeEnd"] {
				t.Errorf("LAN range %v-%v, want %v-%v", r.Start, r.End, tc.lan["rangeStart"], tc.lan["rangeEnd"])
			}
			wantMaster, _ := tc.lan["master"].(string)
			if wantMaster == "" {
				wantMaster = "eth0" // the node's default-route interface
			}
			wantPods, _ := tc.lan["pods"].(string)
			if wantPods == "" {
				wantPods = netconf.PodsAnnotated
			}
			if nc.LAN.Master != wantMaster || nc.LAN.Pods != wantPods || !nc.LAN.HostShim {
				t.Errorf("LAN master %q pods %q hostShim %v, want %s %s true", nc.LAN.Master, nc.LAN.Pods, nc.LAN.HostShim, wantMaster, wantPods)
			}
			if raw["networkPolicy"] != false {
				t.Error("networkPolicy: false rendered as true")
			}
			ds := daemonSet(t, docs)
			agent := container(t, ds.Spec.Template.Spec.Containers, "agent")
			if got := env(container(t, ds.Spec.Template.Spec.InitContainers, "install"), "BACKEND"); got != "vxlan" {
				t.Errorf("BACKEND %q, want vxlan", got)
			}
			hasSysAdmin := slices.Contains(agent.SecurityContext.Capabilities.Add, "SYS_ADMIN")
			if hasSysAdmin != tc.dhcp {
				t.Errorf("agent capabilities %v: SYS_ADMIN only for DHCP (dhcp %v)", agent.SecurityContext.Capabilities.Add, tc.dhcp)
			}
			if tc.dhcp {
				if host, _ := hostPathAt(t, &ds.Spec.Template.Spec, agent, "/var/run/netns"); host != "/run/netns" {
					t.Errorf("agent's /var/run/netns is the host's %s, want /run/netns", host)
				}
				if host, w := hostPathAt(t, &ds.Spec.Template.Spec, agent, "/var/lib/village/dhcp"); host != "/var/lib/village/dhcp" || !w {
					t.Errorf("agent's DHCP leases: host %s writable %v", host, w)
				}
			}
		})
	}
}

// TestValuesRejected: choices Village does not have fail the render, and
// a LAN without its addresses names the missing value.
func TestValuesRejected(t *testing.T) {
	for _, tc := range []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"backend": "geneve"}, "backend"},
		{map[string]any{"lan": map[string]any{"enabled": true}}, "lan.subnet"},
		{map[string]any{"lan": map[string]any{"enabled": true, "subnet": "192.168.50.0/24"}}, "lan.rangeStart"},
		{map[string]any{"lan": map[string]any{"enabled": true, "addresses": "static", "subnet": "192.168.50.0/24"}}, "lan.addresses"},
	} {
		_, err := renderErr(nil, tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: render error %v, want one naming %s", tc.set, err, tc.want)
		}
	}
}

func env(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestLANServicesValues: lan.services.ranges turns Services on the LAN on
// with a gossip key: the conflist's "macvlan.services" (accepted by
// Village's own parser) names the key file the agent mounts from the
// Secret village-gossip, which the chart makes with a random 32-byte key.
// Without ranges there is neither the key nor the section.
func TestLANServicesValues(t *testing.T) {
	lan := map[string]any{"enabled": true, "subnet": "192.168.50.0/24", "rangeStart": "192.168.50.210",
		"rangeEnd": "192.168.50.239", "gateway": "192.168.50.1"}
	off := render(t, nil, map[string]any{"lan": lan})
	if nc, _ := villageEntry(t, off); nc.LAN.Services != nil {
		t.Fatalf("services on without lan.services.ranges: %+v", nc.LAN.Services)
	}
	if s := gossipSecret(off); s != nil {
		t.Fatalf("a gossip Secret without lan.services.ranges: %v", s)
	}
	for _, k := range lanServicesKeys {
		if d := find(off, k); d != nil {
			t.Errorf("%s rendered without lan.services.ranges: the agent gets Services rights only with LAN Services", k)
		}
	}

	lan["services"] = map[string]any{"requireClass": true, "ranges": []any{
		map[string]any{"rangeStart": "192.168.50.240", "rangeEnd": "192.168.50.245"},
		map[string]any{"rangeStart": "192.168.50.250", "rangeEnd": "192.168.50.250"},
	}}
	docs := render(t, nil, map[string]any{"lan": lan})
	nc, _ := villageEntry(t, docs)
	svc := nc.LAN.Services
	if svc == nil || !svc.RequireClass || len(svc.Sets) != 1 || len(svc.Sets[0]) != 2 || svc.GossipKeyFile != "/etc/village/gossip/key" {
		t.Fatalf("macvlan.services %+v, want requireClass, one set of two ranges, the key file /etc/village/gossip/key", svc)
	}
	if r := svc.Sets[0][1]; r.String() != "192.168.50.250-192.168.50.250" || r.Subnet.String() != "192.168.50.0/24" {
		t.Errorf("second range %v in %v, want 192.168.50.250-192.168.50.250 in lan.subnet", r, r.Subnet)
	}
	checkLANServicesObjects(t, docs, "[['192.168.50.240', '192.168.50.245'], ['192.168.50.250', '192.168.50.250']]")
	s := gossipSecret(docs)
	if s == nil {
		t.Fatal("no Secret village-gossip")
	}
	data, _ := s["data"].(map[string]any)
	enc, _ := data["key"].(string)
	text, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatalf("Secret village-gossip: data.key %q: %v", enc, err)
	}
	// The file holds the key as members.ParseKey reads it: base64 text.
	if key, err := base64.StdEncoding.DecodeString(string(text)); err != nil || len(key) != 32 {
		t.Fatalf("Secret village-gossip's key %q: %d bytes, %v; want the base64 of 32", text, len(key), err)
	}
	if again := gossipSecret(render(t, nil, map[string]any{"lan": lan})); again["data"].(map[string]any)["key"] == enc {
		t.Error("two renders without a cluster made the same key: not random")
	}
	ds := daemonSet(t, docs)
	agent := container(t, ds.Spec.Template.Spec.Containers, "agent")
	var mounted bool
	for _, m := range agent.VolumeMounts {
		if m.MountPath == "/etc/village/gossip" {
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == "village-gossip" {
					mounted = m.ReadOnly
				}
			}
		}
	}
	if !mounted {
		t.Error("the agent does not mount Secret village-gossip read-only at /etc/village/gossip")
	}

	// A range is addresses and nothing else: it is written into the
	// admission policy's CEL.
	lan["services"] = map[string]any{"ranges": []any{map[string]any{"rangeStart": "192.168.50.240", "rangeEnd": "192.168.50.245'] + ['8.8.8.8"}}}
	if _, err := renderErr(nil, map[string]any{"lan": lan}); err == nil || !strings.Contains(err.Error(), "is not a range of IP addresses") {
		t.Errorf("lan.services.ranges with CEL in rangeEnd: render error %v", err)
	}
	lan["addresses"] = "dhcp"
	if _, err := renderErr(nil, map[string]any{"lan": lan}); err == nil || !strings.Contains(err.Error(), "lan.services needs lan.addresses pool") {
		t.Errorf("lan.services with DHCP addresses: render error %v", err)
	}
}

// lanServicesKeys are the objects of deploy/kubernetes/examples/homelab/
// lan-services.yaml, which the chart renders only with LAN Services.
var lanServicesKeys = []string{
	"ClusterRole <nil>/village-lan-services", "ClusterRoleBinding <nil>/village-lan-services",
	"ValidatingAdmissionPolicy <nil>/village-lan-services", "ValidatingAdmissionPolicyBinding <nil>/village-lan-services",
}

// find is the rendered object of key k (as key names it), or nil.
func find(docs []map[string]any, k string) map[string]any {
	for _, d := range docs {
		if key(d) == k {
			return d
		}
	}
	return nil
}

// checkLANServicesObjects: the chart renders the home-lab example's
// lan-services.yaml (the agent's Services grant and the policy keeping its
// ingress addresses in the LAN Service ranges) with the policy's variable
// ranges the CEL list ranges made of lan.services.ranges, and nothing else
// changed.
func checkLANServicesObjects(t *testing.T, docs []map[string]any, ranges string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "kubernetes", "examples", "homelab", "lan-services.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := decodeDocs("lan-services.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	if len(example) != len(lanServicesKeys) {
		t.Fatalf("lan-services.yaml holds %d objects, want %v", len(example), lanServicesKeys)
	}
	for _, want := range example {
		got := find(docs, key(want))
		if got == nil {
			t.Errorf("the chart with lan.services.ranges does not render %s of lan-services.yaml", key(want))
			continue
		}
		if want["kind"] == "ValidatingAdmissionPolicy" {
			vars, _ := got["spec"].(map[string]any)["variables"].([]any)
			for _, v := range vars {
				if v := v.(map[string]any); v["name"] == "ranges" {
					if v["expression"] != ranges {
						t.Errorf("%s: ranges %v, want %s (lan.services.ranges)", key(got), v["expression"], ranges)
					}
					v["expression"] = "[['192.168.50.240', '192.168.50.250']]" // the example's
				}
			}
		}
		if !reflect.DeepEqual(got, want) {
			gy, _ := yaml.Marshal(got)
			wy, _ := yaml.Marshal(want)
			t.Errorf("%s: the chart renders\n%s\nlan-services.yaml has\n%s", key(want), gy, wy)
		}
	}
}

// gossipSecret is the rendered Secret village-gossip, or nil.
func gossipSecret(docs []map[string]any) map[string]any {
	for _, d := range docs {
		if md, _ := d["metadata"].(map[string]any); d["kind"] == "Secret" && md["name"] == "village-gossip" {
			return d
		}
	}
	return nil
}
