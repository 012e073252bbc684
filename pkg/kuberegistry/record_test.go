package kuberegistry

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/registry"
)

func node(name string, ann map[string]string, podCIDR string, podCIDRs ...string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: podCIDRs}}
}

func TestRecord(t *testing.T) {
	full := map[string]string{kubenames.AnnotationUnderlayIP: "192.168.1.2", kubenames.AnnotationVtepMAC: "0e:76:c0:a8:01:02"}
	for _, tc := range []struct {
		name      string
		n         *corev1.Node
		ok, err   bool
		ip, cidrs string
	}{
		{"dual stack", node("a", full, "10.244.1.0/24", "10.244.1.0/24", "fd00:1::/64"), true, false, "192.168.1.2", "[10.244.1.0/24 fd00:1::/64]"},
		{"podCIDR only", node("a", full, "10.244.1.0/24"), true, false, "192.168.1.2", "[10.244.1.0/24]"},
		{"no podCIDR yet", node("a", full, ""), false, false, "", ""},
		{"no annotation (no Village)", node("a", nil, "10.244.1.0/24", "10.244.1.0/24"), false, false, "", ""},
		{"mac optional (host-gw)", node("a", map[string]string{kubenames.AnnotationUnderlayIP: "fd00::2"}, "", "10.244.1.0/24"), true, false, "fd00::2", "[10.244.1.0/24]"},
		{"bad ip", node("a", map[string]string{kubenames.AnnotationUnderlayIP: "x"}, "", "10.244.1.0/24"), false, true, "", ""},
		{"bad mac", node("a", map[string]string{kubenames.AnnotationUnderlayIP: "192.168.1.2", kubenames.AnnotationVtepMAC: "zz"}, "", "10.244.1.0/24"), false, true, "", ""},
		{"bad cidr", node("a", full, "", "10.244.1.0/33"), false, true, "", ""},
	} {
		rec, ok, err := Record(tc.n)
		if ok != tc.ok || (err != nil) != tc.err {
			t.Errorf("%s: ok %v err %v", tc.name, ok, err)
			continue
		}
		if ok && (rec.IP != tc.ip || fmtList(rec.PodCIDRs) != tc.cidrs || rec.Name != "a") {
			t.Errorf("%s: %+v", tc.name, rec)
		}
	}
}

// The WireGuard key and endpoint go out as annotations (absent ones
// removed by the merge patch) and come back in the record.
func TestRecordWireGuard(t *testing.T) {
	const key = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	want := registry.Node{Name: "a", IP: "192.168.1.2", PodCIDRs: []string{"10.244.1.0/24"}, VtepMAC: "0e:76:c0:a8:01:02",
		WireGuardKey: key, WireGuardEndpoint: "203.0.113.7:51820"}
	ann := map[string]string{}
	for k, v := range annotations(want) {
		ann[k] = v.(string)
	}
	n := node("a", ann, "10.244.1.0/24")
	if !annotated(n, want) {
		t.Fatalf("annotations %v do not say %+v", ann, want)
	}
	rec, ok, err := Record(n)
	if !ok || err != nil || !rec.Equal(want) {
		t.Fatalf("Record = %+v %v %v, want %+v", rec, ok, err, want)
	}
	plain := want
	plain.WireGuardKey, plain.WireGuardEndpoint = "", ""
	if annotated(n, plain) {
		t.Fatalf("a Node with a WireGuard key says a record without one")
	}
	if a := annotations(plain); a[kubenames.AnnotationWireGuardKey] != nil || a[kubenames.AnnotationWireGuardEndpoint] != nil {
		t.Fatalf("no key must remove the annotations (null in the patch): %v", a)
	}
	n.Annotations[kubenames.AnnotationWireGuardKey] = "x"
	if _, ok, err := Record(n); ok || err == nil {
		t.Fatalf("a bad key annotation: ok %v err %v", ok, err)
	}
}

func fmtList(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}

func TestSlimKeepsWhatRecordReads(t *testing.T) {
	n := node("a", map[string]string{kubenames.AnnotationUnderlayIP: "192.168.1.2", "other.io/x": "big"}, "10.244.1.0/24", "10.244.1.0/24")
	n.ResourceVersion = "7"
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}}}
	out, err := Slim(n)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Node)
	if len(s.Status.Images) != 0 || s.Annotations["other.io/x"] != "" || s.ResourceVersion != "7" {
		t.Fatalf("slim kept %+v", s)
	}
	a, _, _ := Record(n)
	b, _, _ := Record(s)
	if !a.Equal(b) {
		t.Fatalf("record changed by slim: %+v vs %+v", a, b)
	}
}
