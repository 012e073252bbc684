package attack

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/village-cni/village/internal/kubecluster"
)

// NodeTokenServices attacks with a stolen node token (agent: a client with
// the agent's own projected token, read from its node) the Services of a
// cluster that runs LAN Services: the CVE-2020-8554 class, where an ingress
// address written into a LoadBalancer Service's status makes kube-proxy send
// every pod's and node's traffic for that address to the Service. allowedNS
// is a namespace labelled village.cni.io/lan=allowed holding a Village
// Service named web. Each write must be refused by the API server (RBAC or
// deploy/kubernetes/admission.yaml's village-agent); the refusal is logged.
func NodeTokenServices(t *testing.T, c *kubecluster.Cluster, agent kubernetes.Interface, allowedNS string) {
	ctx := context.Background()
	admin := c.Client()
	// A Service of another load balancer, in a namespace Village was never
	// given.
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "attack-svc-"}}
	other, err := admin.CoreV1().Namespaces().Create(ctx, other, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), other.Name, metav1.DeleteOptions{})
	})
	class := "example.com/other-lb"
	victim := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "victim"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class, Selector: map[string]string{"app": "victim"},
		Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := admin.CoreV1().Services(other.Name).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	classless := victim.DeepCopy()
	classless.Name, classless.Spec.LoadBalancerClass = "classless", nil
	if _, err := admin.CoreV1().Services(other.Name).Create(ctx, classless, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ingress := []byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"8.8.8.8","ipMode":"VIP"}]}}}`)
	for _, a := range []struct {
		what  string
		write func() error
	}{
		{"ingress 8.8.8.8 on a Service of another class in another namespace (merge patch of services/status)", func() error {
			_, err := agent.CoreV1().Services(other.Name).Patch(ctx, "victim", ktypes.MergePatchType, ingress, metav1.PatchOptions{}, "status")
			return err
		}},
		{"ingress 8.8.8.8 on a classless Service in a namespace not allowed (merge patch of services/status)", func() error {
			_, err := agent.CoreV1().Services(other.Name).Patch(ctx, "classless", ktypes.MergePatchType, ingress, metav1.PatchOptions{}, "status")
			return err
		}},
		{"ingress 8.8.8.8 on a Service of another class (update of services/status)", func() error {
			s, err := agent.CoreV1().Services(other.Name).Get(ctx, "victim", metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "8.8.8.8"}}
			_, err = agent.CoreV1().Services(other.Name).UpdateStatus(ctx, s, metav1.UpdateOptions{})
			return err
		}},
		{"spec.externalIPs 8.8.8.8 on Village's Service in an allowed namespace", func() error {
			_, err := agent.CoreV1().Services(allowedNS).Patch(ctx, "web", ktypes.MergePatchType, []byte(`{"spec":{"externalIPs":["8.8.8.8"]}}`), metav1.PatchOptions{})
			return err
		}},
		{"spec change (type NodePort) of Village's Service in an allowed namespace", func() error {
			_, err := agent.CoreV1().Services(allowedNS).Patch(ctx, "web", ktypes.MergePatchType, []byte(`{"spec":{"type":"NodePort"}}`), metav1.PatchOptions{})
			return err
		}},
		{"spec change (selector) of Village's Service in an allowed namespace", func() error {
			_, err := agent.CoreV1().Services(allowedNS).Patch(ctx, "web", ktypes.MergePatchType, []byte(`{"spec":{"selector":{"app":"attacker"}}}`), metav1.PatchOptions{})
			return err
		}},
	} {
		err := a.write()
		var st apierrors.APIStatus
		switch {
		case err == nil:
			t.Errorf("ATTACK SUCCEEDED: the agent's token wrote %s", a.what)
		case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
			t.Errorf("%s: %v, want a refusal of the API server (403 Forbidden)", a.what, err)
		default:
			if ok := asStatus(err, &st); ok {
				t.Logf("refused: %s: %d %s: %s", a.what, st.Status().Code, st.Status().Reason, st.Status().Message)
			}
		}
	}
	// Nothing changed what kube-proxy reads.
	for _, name := range []string{"victim", "classless"} {
		s, err := admin.CoreV1().Services(other.Name).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) != 0 {
			t.Errorf("Service %s/%s: ingress %v (%v), want none", other.Name, name, s.Status.LoadBalancer.Ingress, err)
		}
	}
	if s, err := admin.CoreV1().Services(allowedNS).Get(ctx, "web", metav1.GetOptions{}); err != nil || len(s.Spec.ExternalIPs) != 0 || s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Errorf("Service %s/web: externalIPs %v, type %s (%v): want none and LoadBalancer", allowedNS, s.Spec.ExternalIPs, s.Spec.Type, err)
	}
}

func asStatus(err error, st *apierrors.APIStatus) bool {
	s, ok := err.(apierrors.APIStatus)
	if ok {
		*st = s
	}
	return ok
}
