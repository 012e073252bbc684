package village

import (
	"encoding/json"
	"testing"

	"github.com/village-cni/village/pkg/agentsock"
)

// A lease becomes net1's address with the router as its gateway, and no
// route or DNS (those stay eth0's); a bad answer is an error.
func TestLeaseResult(t *testing.T) {
	r, err := leaseResult(&agentsock.Lease{Address: "192.168.77.120/24", Gateway: "192.168.77.1", DNS: []string{"192.168.77.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.IPs) != 1 || r.IPs[0].Address.String() != "192.168.77.120/24" || r.IPs[0].Gateway.String() != "192.168.77.1" {
		t.Fatalf("result %+v", r)
	}
	if len(r.Routes) != 0 || len(r.DNS.Nameservers) != 0 {
		t.Fatalf("the lease's result has routes or DNS: %+v", r)
	}
	for _, bad := range []*agentsock.Lease{nil, {Address: "192.168.77.120"}, {Address: ""}} {
		if _, err := leaseResult(bad); err == nil {
			t.Errorf("lease %+v accepted", bad)
		}
	}
}

// GC's list of live attachments comes from the runtime's list, already
// renamed to the LAN interface by withIPAM; no list means none live.
func TestGCValid(t *testing.T) {
	in := []byte(`{"cniVersion":"1.1.0","name":"n","type":"village","ipam":{"type":"village-ipam"},
		"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"b","ifname":"eth0"}]}`)
	out, err := withIPAM(in, json.RawMessage(`{"type":"dhcp"}`), "net1")
	if err != nil {
		t.Fatal(err)
	}
	valid, err := gcValid(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []agentsock.Attachment{{ContainerID: "a", IfName: "net1"}, {ContainerID: "b", IfName: "net1"}}
	if len(valid) != 2 || valid[0] != want[0] || valid[1] != want[1] {
		t.Fatalf("valid %+v, want %+v", valid, want)
	}
	valid, err = gcValid([]byte(`{"cniVersion":"1.1.0","name":"n"}`))
	if err != nil || valid == nil || len(valid) != 0 {
		t.Fatalf("no list: %+v %v, want an empty list (GC releases every lease of the network)", valid, err)
	}
}
