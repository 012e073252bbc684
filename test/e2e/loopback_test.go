package e2e

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/testenv"
)

func TestLoopback(t *testing.T) {
	n := NewNode(t)
	pod := n.NewPod()
	testenv.MustIP(t, pod.NS, "link", "set", "lo", "down")
	l := ConfList(t, `{"cniVersion":"1.1.0","name":"lo","plugins":[{"type":"loopback"}]}`)
	r := n.MustAdd(l, pod)
	if len(r.IPs) == 0 || r.IPs[0].Address.IP.String() != "127.0.0.1" {
		t.Fatalf("loopback result: %+v", r)
	}
	if out := testenv.MustIP(t, pod.NS, "-o", "link", "show", "lo"); !strings.Contains(out, "UP") {
		t.Fatalf("lo not up: %s", out)
	}
	must(t, n.Check(l, pod), "CHECK")
	testenv.MustIP(t, pod.NS, "link", "set", "lo", "down")
	if err := n.Check(l, pod); err == nil || !strings.Contains(err.Error(), "lo is down") {
		t.Fatalf("CHECK with lo down: %v", err)
	}
	must(t, n.Del(l, pod), "DEL")
	// Every version in and out.
	for _, ver := range []string{"0.1.0", "0.2.0", "0.3.1", "0.4.0", "1.0.0"} {
		lv := ConfList(t, `{"cniVersion":"`+ver+`","name":"lo","plugins":[{"type":"loopback"}]}`)
		res, err := n.Add(lv, pod)
		must(t, err, "ADD %s", ver)
		if res.Version() != ver {
			t.Fatalf("result version %s, want %s", res.Version(), ver)
		}
	}
	// The host's own namespace is refused; DEL tolerates a vanished netns.
	out := n.Exec(testenv.Call{Bin: "loopback", Command: "ADD", ContainerID: "x", Netns: "/proc/self/ns/net", IfName: "lo",
		Stdin: []byte(`{"cniVersion":"1.1.0","name":"lo","type":"loopback"}`)})
	if e := CNIError(t, out); e.Code != types.ErrInvalidNetNS {
		t.Fatalf("ADD on the host netns: code %d %s", e.Code, e.Msg)
	}
	// village refuses the host's namespace on DEL as on ADD, with the same code.
	out = n.Exec(testenv.Call{Bin: "village", Command: "DEL", ContainerID: "x", Netns: "/proc/self/ns/net", IfName: "eth0",
		Stdin: []byte(`{"cniVersion":"1.1.0","name":"hostdel","type":"village"}`)})
	if e := CNIError(t, out); e.Code != types.ErrInvalidNetNS {
		t.Fatalf("village DEL on the host netns: code %d %s", e.Code, e.Msg)
	}
	out = n.Exec(testenv.Call{Bin: "loopback", Command: "DEL", ContainerID: "x", Netns: "/run/netns/gone-village-lo", IfName: "lo",
		Stdin: []byte(`{"cniVersion":"1.1.0","name":"lo","type":"loopback"}`)})
	if out.ExitCode != 0 {
		t.Fatalf("DEL with the netns gone: %s", out.Stdout)
	}
}
