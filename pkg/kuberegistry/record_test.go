package kuberegistry

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/pkg/kubenames"
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
