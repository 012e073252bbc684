package attack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/village-cni/village/internal/crienv"
	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// wait bounds every wait for a condition of the cluster: generous, since
// the test command must never fail because the machine is loaded.
const wait = 3 * time.Minute

// Tenant is a user with one namespace: the built-in "admin" ClusterRole
// bound in that namespace alone (what a cluster owner gives a team), and a
// client that acts as that user (impersonation of its ServiceAccount, as
// the API server authorizes it: RBAC and admission see the tenant, not the
// test's admin).
type Tenant struct {
	NS     string
	Client kubernetes.Interface
	c      *kubecluster.Cluster
}

// NewTenant makes namespace ns, gives it the LAN when lan is true (the
// label only the cluster owner may set), and returns its user.
func NewTenant(t testing.TB, c *kubecluster.Cluster, ns string, lan bool) *Tenant {
	t.Helper()
	ctx := context.Background()
	admin := c.Client()
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if lan {
		n.Labels = map[string]string{kubenames.LabelLAN: kubenames.LabelLANAllowed}
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("ServiceAccount %s/tenant: %v", ns, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tenant", Namespace: ns}},
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("RoleBinding %s/tenant-admin: %v", ns, err)
	}
	cfg := rest.CopyConfig(c.API().Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":tenant"}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("tenant client: %v", err)
	}
	// The binding takes effect when the API server's RBAC cache has it.
	if err := kubecluster.Poll(wait, func() error {
		_, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err
	}); err != nil {
		t.Fatalf("tenant of %s cannot list its own pods: %v", ns, err)
	}
	return &Tenant{NS: ns, Client: cs, c: c}
}

// Pod creates a pod of the tools image on node, answering TCP on 8080,
// with the annotations given.
func (tn *Tenant) Pod(t testing.TB, name, node string, ann map[string]string) {
	t.Helper()
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}, Annotations: ann},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: crienv.ToolsImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/pause", "-listen", ":8080", "-reply", name},
			}},
		},
	}
	if _, err := tn.Client.CoreV1().Pods(tn.NS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant pod %s/%s: %v", tn.NS, name, err)
	}
}

// LoadBalancer creates a LoadBalancer Service selecting app=selector, with
// the annotations and class given ("" for none).
func (tn *Tenant) LoadBalancer(t testing.TB, name, selector, class string, ann map[string]string) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": selector},
			Ports:    []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	if class != "" {
		svc.Spec.LoadBalancerClass = &class
	}
	if _, err := tn.Client.CoreV1().Services(tn.NS).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant Service %s/%s: %v", tn.NS, name, err)
	}
}

// WaitEvent waits for a Warning Event with reason on the tenant's object
// (kind Pod or Service) and returns its message.
func (tn *Tenant) WaitEvent(t testing.TB, kind, name, reason string) string {
	t.Helper()
	var msg string
	var seen []string
	if err := kubecluster.Poll(wait, func() error {
		evs, err := tn.c.Client().CoreV1().Events(tn.NS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name})
		if err != nil {
			return err
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
			if e.Type == corev1.EventTypeWarning && e.Reason == reason {
				msg = e.Message
				return nil
			}
		}
		return fmt.Errorf("no Warning %s Event", reason)
	}); err != nil {
		t.Fatalf("%s %s/%s: %v; Events: %q", kind, tn.NS, name, err, seen)
	}
	return msg
}

// LANAttack is what NamespaceUserOnTheLAN aims at.
type LANAttack struct {
	// Held is a LAN Service address of another namespace (it must stay
	// that namespace's), and HeldShare the lan-share key that Service's
	// namespace uses for it ("" if none).
	Held, HeldShare string
	// Node is the node the tenant's pods run on.
	Node string
}

// protected are the LAN addresses Village must never answer for nor hand
// out, whatever a tenant asks: the LAN's router (which is also the API
// server here), every node's own address, and a plain LAN host, in both
// families.
func protected(c *kubecluster.Cluster) []string {
	p := []string{kubecluster.LANIP, kubecluster.LANClientIP, kubecluster.LANIP6, kubecluster.LANClientIP6}
	for _, n := range c.Nodes() {
		p = append(p, n.IP, n.IP6)
	}
	return p
}

// NamespaceUserOnTheLAN attacks a cluster with LAN pods and LAN Services
// on as a user with one namespace that was given the LAN. The tenant aims
// every key it controls (a pod's and a Service's lan-ip, lan-share, the
// class) at the addresses Village must never take: the router, the nodes,
// another LAN host, another namespace's Service address. Each request is
// refused with its Warning Event, no status names the address, and on the
// LAN the owners of those addresses alone answer for them, before and
// after. The tenant also cannot give a namespace the LAN, nor write a
// Service's status itself.
func NamespaceUserOnTheLAN(t *testing.T, c *kubecluster.Cluster, a LANAttack) {
	ctx := context.Background()
	tn := NewTenant(t, c, "attack-tenant", true)
	before := map[string][]string{}
	for _, ip := range protected(c) {
		// Every protected address has an owner on the LAN: asked again
		// while the answer is empty (a slow owner, not a missing one).
		before[ip] = answers(t, c, ip)
		for retry := 0; len(before[ip]) == 0 && retry < 5; retry++ {
			before[ip] = answers(t, c, ip)
		}
	}

	t.Run("PodLANIPAtProtected", func(t *testing.T) {
		for i, ip := range protected(c) {
			name := fmt.Sprintf("grab-%d", i)
			tn.Pod(t, name, a.Node, map[string]string{kubenames.AnnotationLANIP: ip})
			tn.WaitEvent(t, "Pod", name, kubenames.ReasonLANOutsidePool)
			p, err := tn.Client.CoreV1().Pods(tn.NS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := p.Annotations[kubenames.AnnotationLANAddress]; ok {
				t.Errorf("pod asking for %s got %s %q", ip, kubenames.AnnotationLANAddress, v)
			}
		}
	})
	t.Run("ServiceLANIPAtProtected", func(t *testing.T) {
		for i, ip := range protected(c) {
			for _, class := range []string{"", kubenames.LoadBalancerClassLAN} {
				name := fmt.Sprintf("grab-%d%s", i, map[string]string{"": "", kubenames.LoadBalancerClassLAN: "-class"}[class])
				tn.LoadBalancer(t, name, "grab-0", class, map[string]string{kubenames.AnnotationLANIP: ip})
				tn.WaitEvent(t, "Service", name, kubenames.ReasonLANOutsidePool)
				noIngress(t, tn, name)
			}
		}
	})
	t.Run("ServiceLANIPOfAnotherNamespace", func(t *testing.T) {
		ann := map[string]string{kubenames.AnnotationLANIP: a.Held}
		if a.HeldShare != "" {
			// The same share key as the owner's: keys are per namespace.
			ann[kubenames.AnnotationLANShare] = a.HeldShare
		}
		tn.LoadBalancer(t, "steal", "grab-0", "", ann)
		tn.WaitEvent(t, "Service", "steal", kubenames.ReasonLANTaken)
		noIngress(t, tn, "steal")
	})
	t.Run("CannotGiveANamespaceTheLAN", func(t *testing.T) {
		patch := []byte(`{"metadata":{"labels":{"` + kubenames.LabelLAN + `":"` + kubenames.LabelLANAllowed + `"}}}`)
		for _, ns := range []string{tn.NS, "default"} {
			_, err := tn.Client.CoreV1().Namespaces().Patch(ctx, ns, "application/merge-patch+json", patch, metav1.PatchOptions{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("tenant labelling namespace %s %s: %v, want Forbidden", ns, kubenames.LabelLAN, err)
			}
		}
	})
	t.Run("CannotWriteServiceStatus", func(t *testing.T) {
		patch := []byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"` + kubecluster.LANIP + `"}]}}}`)
		_, err := tn.Client.CoreV1().Services(tn.NS).Patch(ctx, "steal", "application/merge-patch+json", patch, metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) {
			t.Errorf("tenant writing its Service's status.loadBalancer: %v, want Forbidden", err)
		}
	})
	t.Run("OwnersAloneAnswer", func(t *testing.T) {
		for ip, want := range before {
			// Asked three times: a node that took the address would answer
			// on each (its speaker answers every request for what it holds).
			// A question nobody answered (a slow owner on a loaded machine)
			// is asked again; only another MAC fails.
			for range 3 {
				got := answers(t, c, ip)
				for retry := 0; len(got) == 0 && len(want) != 0 && retry < 5; retry++ {
					got = answers(t, c, ip)
				}
				if !slices.Equal(got, want) && len(got) != 0 {
					t.Errorf("after the attack %s is answered by %v, before by %v", ip, got, want)
					break
				}
			}
		}
	})
}

// answers asks for ip on the LAN (ARP or NDP by family) from a namespace
// that is not ip's owner, and returns the sorted MACs that answered. An
// address nobody holds answers nothing.
func answers(t testing.TB, c *kubecluster.Cluster, ip string) []string {
	t.Helper()
	from, ifname := c.LANClient(), "eth0"
	if ip == kubecluster.LANClientIP || ip == kubecluster.LANClientIP6 {
		from, ifname = c.LAN(), "lan0"
	}
	addr := netip.MustParseAddr(ip)
	ask := testenv.NDPAnswers
	if addr.Is4() {
		ask = testenv.ARPAnswers
	}
	macs, err := ask(from, ifname, addr, 2*time.Second)
	if err != nil {
		t.Fatalf("who has %s: %v", ip, err)
	}
	slices.Sort(macs)
	return slices.Compact(macs)
}

// noIngress fails if the tenant's Service has a load-balancer address.
func noIngress(t testing.TB, tn *Tenant, name string) {
	t.Helper()
	svc, err := tn.c.Client().CoreV1().Services(tn.NS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in := svc.Status.LoadBalancer.Ingress; len(in) != 0 {
		var ips []string
		for _, i := range in {
			ips = append(ips, i.IP)
		}
		t.Errorf("Service %s/%s got ingress %s", tn.NS, name, strings.Join(ips, ","))
	}
}
