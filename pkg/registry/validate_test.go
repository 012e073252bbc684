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
}
