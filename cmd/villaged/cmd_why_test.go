package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

func TestParsePortProto(t *testing.T) {
	for _, tc := range []struct {
		in    string
		port  uint16
		proto table.Proto
		err   string
	}{
		{"80", 80, table.ProtoTCP, ""},
		{"80/tcp", 80, table.ProtoTCP, ""},
		{"53/UDP", 53, table.ProtoUDP, ""},
		{"9000/sctp", 9000, table.ProtoSCTP, ""},
		{"65535", 65535, table.ProtoTCP, ""},
		{"0", 0, 0, "want a number from 1 to 65535"},
		{"65536", 0, 0, "want a number from 1 to 65535"},
		{"-1", 0, 0, "want a number"},
		{"http", 0, 0, "want a number"},
		{"", 0, 0, "want a number"},
		{"/tcp", 0, 0, "want a number"},
		{"80/", 0, 0, `protocol ""`},
		{"80/icmp", 0, 0, `protocol "icmp": want tcp, udp or sctp`},
		{"80/tcp/udp", 0, 0, "want tcp, udp or sctp"},
		{" 80", 0, 0, "want a number"},
	} {
		port, proto, err := ParsePortProto(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || port != tc.port || proto != tc.proto {
			t.Errorf("%q: %d %v %v, want %d %v", tc.in, port, proto, err, tc.port, tc.proto)
		}
	}
}

// FuzzParsePortProto: any text is a port and protocol NetworkPolicy can
// name, or an error; what it accepts prints back to the same.
func FuzzParsePortProto(f *testing.F) {
	for _, s := range []string{"80", "53/udp", "9000/SCTP", "0", "80/x", "65536/tcp", "/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		port, proto, err := ParsePortProto(s)
		if err != nil {
			return
		}
		if port == 0 || (proto != table.ProtoTCP && proto != table.ProtoUDP && proto != table.ProtoSCTP) {
			t.Fatalf("%q: %d/%v", s, port, proto)
		}
		again, p2, err := ParsePortProto(fmt.Sprintf("%d/%s", port, proto))
		if err != nil || again != port || p2 != proto {
			t.Fatalf("%q: %d/%v does not parse back: %v", s, port, proto, err)
		}
	})
}

// whyLab is a conflist with networkPolicy on and a run directory holding
// the model the controller would write for its policies: np/web
// (10.80.1.2, this node) isolated by deny-web, opened to np/far on
// 8080/TCP by far-to-web; np/far (10.80.2.2) on another node.
func whyLab(t *testing.T, policy bool) (conf, run string) {
	dir := t.TempDir()
	conf, run = filepath.Join(dir, "net.conflist"), filepath.Join(dir, "run")
	text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"why","plugins":[{"type":"village","bridge":"why0","isGateway":true,"networkPolicy":%v,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.80.1.0/24"}]]}}]}`, policy, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := func(name, ip string) *netpol.Pod {
		return &netpol.Pod{Namespace: "np", Name: name, Labels: map[string]string{"app": name}, IPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	alt := intstr.FromInt32(8080)
	tcp := corev1.ProtocolTCP
	sel := func(app string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	}
	far := sel("far")
	in := netpol.Input{Network: "why", Pods: []*netpol.Pod{pod("web", "10.80.1.2"), pod("far", "10.80.2.2")},
		Namespaces: map[string]map[string]string{"np": nil}, Local: map[string]bool{"np/web": true},
		Policies: []*networkingv1.NetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: "deny-web"}, Spec: networkingv1.NetworkPolicySpec{PodSelector: sel("web")}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: "far-to-web"}, Spec: networkingv1.NetworkPolicySpec{PodSelector: sel("web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &far}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &alt}}}}}},
		}}
	b, err := json.Marshal(netpol.BuildModel(in))
	if err != nil {
		t.Fatal(err)
	}
	if policy {
		if err := nodelocal.WriteFile(controller.ModelPath(run, "why"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return conf, run
}

// TestWhy runs the command as villaged does, on a model file: the
// verdict, its reasons and its exit status.
func TestWhy(t *testing.T) {
	conf, run := whyLab(t, true)
	why := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := runMain(append([]string{"why", "--conf", conf, "--node-name", "n1", "--run-dir", run}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"np/far", "np/web", "8080"}, 0, []string{"allowed: np/far (10.80.2.2) -> np/web (10.80.1.2) port 8080/TCP\n",
			"ingress: allowed by np/far-to-web spec.ingress[0].from[0] port 8080/TCP", "egress:  pod np/far is not isolated for egress", "(as compiled on this node at "}},
		{[]string{"np/far", "np/web", "80"}, 1, []string{"denied: np/far (10.80.2.2) -> np/web (10.80.1.2) port 80/TCP\n",
			"denied: pod np/web is isolated for ingress by np/deny-web, np/far-to-web and no rule admits 10.80.2.2 to 80/TCP"}},
		{[]string{"10.80.2.2", "10.80.1.2", "8080/udp"}, 1, []string{"port 8080/UDP"}},
		{[]string{"np/far", "--json", "np/web", "8080/tcp"}, 0, []string{`"allowed": true`, `"where": "spec.ingress[0].from[0]"`}},
		{[]string{"np/far", "np/web"}, 0, []string{"any port (on port 8080/TCP)"}},
		{[]string{"np/web", "np/nope", "80"}, 2, []string{"pod np/nope: not known to the policy controller of network why"}},
		{[]string{"np/web"}, 2, []string{`want FROM TO [PORT[/PROTO]], got ["np/web"]`}},
		{[]string{"np/web", "np/far", "80/icmp"}, 2, []string{`protocol "icmp"`}},
		{[]string{"web", "np/far"}, 2, []string{`FROM: "web": want namespace/pod or an IP address`}},
	} {
		code, out, errs := why(tc.args...)
		if code != tc.code {
			t.Errorf("why %v: exit %d, want %d\n%s%s", tc.args, code, tc.code, out, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(out+errs, w) {
				t.Errorf("why %v does not say %q:\n%s%s", tc.args, w, out, errs)
			}
		}
	}
	if code, _, errs := why(); code != 2 || !strings.Contains(errs, "usage: villaged why") {
		t.Errorf("why without arguments: exit %d, %s", code, errs)
	}

	// no model yet: said, exit 2
	if err := os.Remove(controller.ModelPath(run, "why")); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := why("np/far", "np/web", "80"); code != 2 || !strings.Contains(errs, "the policy controller of network why has not compiled yet") {
		t.Errorf("why without a model: exit %d\n%s%s", code, out, errs)
	}
	// policy off
	conf, run = whyLab(t, false)
	if code, out, errs := why("np/far", "np/web", "80"); code != 2 || !strings.Contains(errs, "NetworkPolicy is off on network why") {
		t.Errorf("why with policy off: exit %d\n%s%s", code, out, errs)
	}
}
