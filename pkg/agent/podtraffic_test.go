package agent

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodsByAddr: a pod address names its pod; an address two live pods
// claim names neither; host-network and finished pods name nothing.
func TestPodsByAddr(t *testing.T) {
	pod := func(name string, phase corev1.PodPhase, host bool, ips ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: corev1.PodSpec{HostNetwork: host}, Status: corev1.PodStatus{Phase: phase}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	for _, tc := range []struct {
		what string
		pods []*corev1.Pod
		want map[string]string
	}{
		{"one pod, both families", []*corev1.Pod{pod("a", corev1.PodRunning, false, "10.0.0.2", "fd00::2")},
			map[string]string{"10.0.0.2": "ns/a", "fd00::2": "ns/a"}},
		{"two pods, one address", []*corev1.Pod{pod("a", corev1.PodRunning, false, "10.0.0.2"), pod("b", corev1.PodPending, false, "10.0.0.2")},
			map[string]string{"10.0.0.2": ""}},
		{"a finished pod keeps an address given again", []*corev1.Pod{pod("old", corev1.PodSucceeded, false, "10.0.0.2"),
			pod("failed", corev1.PodFailed, false, "10.0.0.2"), pod("new", corev1.PodRunning, false, "10.0.0.2")},
			map[string]string{"10.0.0.2": "ns/new"}},
		{"host network", []*corev1.Pod{pod("h", corev1.PodRunning, true, "192.168.1.10")}, map[string]string{}},
		{"the same pod twice (an informer's update)", []*corev1.Pod{pod("a", corev1.PodRunning, false, "10.0.0.2"), pod("a", corev1.PodRunning, false, "10.0.0.2")},
			map[string]string{"10.0.0.2": "ns/a"}},
	} {
		if got := podsByAddr(tc.pods); !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, got, tc.want)
		}
	}
}
