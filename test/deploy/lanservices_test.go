package deploy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

// lanServicesObjects is deploy/kubernetes/examples/homelab/lan-services.yaml,
// decoded strictly: what only a cluster with LAN Services installs.
type lanServicesObjects struct {
	role          *rbacv1.ClusterRole
	binding       *rbacv1.ClusterRoleBinding
	policy        *admissionv1.ValidatingAdmissionPolicy
	policyBinding *admissionv1.ValidatingAdmissionPolicyBinding
}

func loadLANServices(t *testing.T) lanServicesObjects {
	t.Helper()
	var o lanServicesObjects
	objs := decodeFile(t, filepath.Join(homelabDir(t), "lan-services.yaml"))
	for _, obj := range objs {
		switch v := obj.(type) {
		case *rbacv1.ClusterRole:
			o.role = v
		case *rbacv1.ClusterRoleBinding:
			o.binding = v
		case *admissionv1.ValidatingAdmissionPolicy:
			o.policy = v
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			o.policyBinding = v
		}
	}
	if len(objs) != 4 || o.role == nil || o.binding == nil || o.policy == nil || o.policyBinding == nil {
		t.Fatalf("lan-services.yaml: %d objects (%v), want one ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy and binding", len(objs), kinds(objs))
	}
	return o
}

func kinds(objs []runtime.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetObjectKind().GroupVersionKind().Kind)
	}
	return out
}

// lanServicesPolicy is the example's ValidatingAdmissionPolicy
// village-lan-services.
func lanServicesPolicy(t *testing.T) *admissionv1.ValidatingAdmissionPolicy {
	t.Helper()
	return loadLANServices(t).policy
}

// setRanges replaces the policy's variable "ranges" (the LAN Service
// ranges, a CEL list of [first, last] pairs) with expr.
func setRanges(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, expr string) {
	t.Helper()
	i := slices.IndexFunc(p.Spec.Variables, func(v admissionv1.Variable) bool { return v.Name == "ranges" })
	if i < 0 {
		t.Fatalf("policy %s has no variable ranges", p.Name)
	}
	p.Spec.Variables[i].Expression = expr
}

// TestLANServicesExample: the home-lab example's lan-services.yaml grants
// the agent exactly what LAN Services use (what deploy/kubernetes/rbac.yaml
// no longer grants, TestRBAC), bound to its ServiceAccount, and guards its
// Services' status with village-lan-services: the agent's Service updates,
// Deny, failing closed. TestAdmissionPolicyDecisions evaluates the policy.
func TestLANServicesExample(t *testing.T) {
	o := loadLANServices(t)
	agent := load(t).serviceAccounts[0]
	want := []string{"[] [services] [] [get list patch watch]", "[] [services/status] [] [patch update]",
		"[discovery.k8s.io] [endpointslices] [] [list watch]"}
	if got := ruleStrings(t, o.role.Rules); o.role.Name != "village-lan-services" || !slices.Equal(got, want) {
		t.Errorf("ClusterRole %s grants %q, want village-lan-services granting %q", o.role.Name, got, want)
	}
	b := o.binding
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != o.role.Name || b.RoleRef.APIGroup != "rbac.authorization.k8s.io" ||
		len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != agent.Name || b.Subjects[0].Namespace != agent.Namespace {
		t.Errorf("ClusterRoleBinding %s: %+v to %+v, want ClusterRole %s to ServiceAccount %s/%s", b.Name, b.RoleRef, b.Subjects, o.role.Name, agent.Namespace, agent.Name)
	}
	p := o.policy.Spec
	if o.policy.Name != "village-lan-services" || p.FailurePolicy == nil || *p.FailurePolicy != admissionv1.Fail || p.ParamKind != nil {
		t.Errorf("policy %s: failurePolicy %v, paramKind %v; want village-lan-services, Fail and no params", o.policy.Name, p.FailurePolicy, p.ParamKind)
	}
	if user := "request.userInfo.username == 'system:serviceaccount:" + agent.Namespace + ":" + agent.Name + "'"; len(p.MatchConditions) != 1 || p.MatchConditions[0].Expression != user {
		t.Errorf("policy %s matches %+v, want only %s", o.policy.Name, p.MatchConditions, user)
	}
	if mc := p.MatchConstraints; mc == nil || len(mc.ResourceRules) != 1 ||
		!slices.Equal(mc.ResourceRules[0].Resources, []string{"services", "services/status"}) ||
		!slices.Equal(mc.ResourceRules[0].Operations, []admissionv1.OperationType{admissionv1.Update}) {
		t.Errorf("policy %s: matchConstraints %+v, want UPDATE of services and services/status", o.policy.Name, mc)
	}
	var all strings.Builder
	for _, v := range p.Validations {
		all.WriteString(v.Expression)
	}
	for _, m := range []string{"variables.added.all(i, has(i.ip) && !has(i.hostname)", "containsIP"} {
		if !strings.Contains(all.String(), m) {
			t.Errorf("policy %s does not check %s", o.policy.Name, m)
		}
	}
	pb := o.policyBinding
	if pb.Spec.PolicyName != o.policy.Name || !slices.Equal(pb.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) || pb.Spec.ParamRef != nil {
		t.Errorf("binding %s: %+v, want %s with Deny and no params", pb.Name, pb.Spec, o.policy.Name)
	}
}

// TestLANServicesRangeCheck: village-lan-services' range check (CEL has no
// order on addresses: it compares bit by bit with cidr().containsIP())
// agrees with net/netip's order on random ranges and addresses of both
// families, most of them at a range's ends and one off them.
func TestLANServicesRangeCheck(t *testing.T) {
	p := lanServicesPolicy(t)
	rng := rand.New(rand.NewPCG(46, 1))
	random := func(bits int) netip.Addr {
		b := make([]byte, bits/8)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		a, _ := netip.AddrFromSlice(b)
		return a
	}
	agent := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:village", Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}}
	services := schema.GroupVersionResource{Version: "v1", Resource: "services"}
	svc := func(ips ...string) *unstructured.Unstructured {
		in := []any{}
		for _, ip := range ips {
			in = append(in, map[string]any{"ip": ip, "ipMode": "VIP"})
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service",
			"metadata": map[string]any{"name": "web", "namespace": "ns"},
			"spec":     map[string]any{"type": "LoadBalancer"}, "status": map[string]any{"loadBalancer": map[string]any{"ingress": in}}}}
	}
	for _, bits := range []int{32, 128} {
		for range 12 {
			first, last := random(bits), random(bits)
			if last.Less(first) {
				first, last = last, first
			}
			q := p.DeepCopy()
			setRanges(t, q, fmt.Sprintf("[['%s', '%s']]", first, last))
			c := compilePolicy(t, q)
			for _, a := range []netip.Addr{first, last, first.Prev(), first.Next(), last.Prev(), last.Next(), random(bits), random(bits)} {
				if !a.IsValid() {
					continue
				}
				want := !a.Less(first) && !last.Less(a)
				va := &admission.VersionedAttributes{VersionedKind: schema.GroupVersionKind{Version: "v1", Kind: "Service"},
					VersionedObject: admission.NewLazyObject(svc(a.String())), VersionedOldObject: admission.NewLazyObject(svc())}
				va.Attributes = admission.NewAttributesRecord(nil, nil, va.VersionedKind, "ns", "web", services, "status", admission.Update, nil, false, agent)
				got, why := c.decide(t, va, services, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
				if got != want {
					t.Errorf("%s in %s-%s: policy allows %v, want %v (%q)", a, first, last, got, want, why)
				}
			}
		}
	}
}

// BenchmarkLANServicesRangeCheck: what village-lan-services adds to one
// status write of the agent, evaluated by the API server's CEL code: one
// new IPv6 address (128 bits to compare) against three ranges, the last
// one holding it.
func BenchmarkLANServicesRangeCheck(b *testing.B) {
	t := &testing.T{}
	p := lanServicesPolicy(t)
	setRanges(t, p, "[['192.168.50.20', '192.168.50.99'], ['192.168.50.110', '192.168.50.199'], ['fd00:50::150', 'fd00:50::159']]")
	c := compilePolicy(t, p)
	services := schema.GroupVersionResource{Version: "v1", Resource: "services"}
	agent := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:village", Extra: map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}}
	svc := func(ips ...any) *unstructured.Unstructured {
		in := []any{}
		for _, ip := range ips {
			in = append(in, map[string]any{"ip": ip, "ipMode": "VIP"})
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service",
			"metadata": map[string]any{"name": "web", "namespace": "ns"},
			"spec":     map[string]any{"type": "LoadBalancer"}, "status": map[string]any{"loadBalancer": map[string]any{"ingress": in}}}}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
	for b.Loop() {
		va := &admission.VersionedAttributes{VersionedKind: schema.GroupVersionKind{Version: "v1", Kind: "Service"},
			VersionedObject: admission.NewLazyObject(svc("fd00:50::157")), VersionedOldObject: admission.NewLazyObject(svc())}
		va.Attributes = admission.NewAttributesRecord(nil, nil, va.VersionedKind, "ns", "web", services, "status", admission.Update, nil, false, agent)
		if ok, why := c.decide(t, va, services, ns); !ok {
			b.Fatalf("denied: %q", why)
		}
	}
}
