package registry

import "testing"

// TestNodeValidate: a record's name is a Kubernetes Node name (the rule of
// pkg/validate; the registry once took any 1-253 bytes without '/', spaces
// or control bytes) and its VTEP MAC a unicast 6-byte MAC.
func TestNodeValidate(t *testing.T) {
	good := Node{Name: "node-1.example", IP: "192.0.2.1", PodCIDRs: []string{"10.244.1.0/24"}, VtepMAC: "0a:58:00:00:00:01"}
	if err := good.Validate(); err != nil {
		t.Fatalf("%+v: %v", good, err)
	}
	for _, name := range []string{"Node1", "node_1", "-n", "n..x", ""} {
		n := good
		n.Name = name
		if n.Validate() == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	for _, mac := range []string{"01:00:5e:00:00:01", "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", "x"} {
		n := good
		n.VtepMAC = mac
		if n.Validate() == nil {
			t.Errorf("vtepMAC %q accepted", mac)
		}
	}
	wg := good
	wg.WireGuardKey, wg.WireGuardEndpoint = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=", "[2001:db8::7]:51820"
	if err := wg.Validate(); err != nil {
		t.Fatalf("%+v: %v", wg, err)
	}
	if wg.Equal(good) || !wg.Equal(wg) {
		t.Errorf("Equal does not tell records by their WireGuard key and endpoint")
	}
	for _, key := range []string{"x", "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8yk=", "AAAA"} {
		n := wg
		n.WireGuardKey = key
		if n.Validate() == nil {
			t.Errorf("wireguardKey %q accepted", key)
		}
	}
	for _, ep := range []string{"203.0.113.7", "node1:51820", "203.0.113.7:70000"} {
		n := wg
		n.WireGuardEndpoint = ep
		if n.Validate() == nil {
			t.Errorf("wireguardEndpoint %q accepted", ep)
		}
	}
}
