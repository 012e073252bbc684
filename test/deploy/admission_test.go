package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

// compiledPolicy is one ValidatingAdmissionPolicy compiled the way the API
// server's admission plugin compiles it (k8s.io/apiserver's own code).
type compiledPolicy struct {
	match, validate cel.ConditionEvaluator
	// messages are the validations' messageExpressions, in their order
	// (nil where a validation has none), evaluated when it denies: a
	// messageExpression that does not compile or errs is a bug too.
	messages []cel.ConditionEvaluator
}

func compilePolicy(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy) compiledPolicy {
	t.Helper()
	c, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	opt := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	var vars []cel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		vars = append(vars, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	c.CompileAndStoreVariables(vars, opt, environment.StoredExpressions)
	var vs, ms []cel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		vs = append(vs, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message})
	}
	for _, m := range p.Spec.MatchConditions {
		ms = append(ms, &validating.ValidationCondition{Expression: m.Expression})
	}
	cp := compiledPolicy{match: c.CompileCondition(ms, opt, environment.StoredExpressions), validate: c.CompileCondition(vs, opt, environment.StoredExpressions)}
	for _, v := range p.Spec.Validations {
		var m cel.ConditionEvaluator
		if v.MessageExpression != "" {
			m = c.CompileCondition([]cel.ExpressionAccessor{&validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}}, opt, environment.StoredExpressions)
		}
		cp.messages = append(cp.messages, m)
	}
	return cp
}

// decide is the policy's answer to one request: denied (with the failing
// expressions) or allowed; an expression that errs denies, as
// failurePolicy Fail makes it.
func (p compiledPolicy) decide(t *testing.T, va *admission.VersionedAttributes, res schema.GroupVersionResource, ns *corev1.Namespace) (allowed bool, why []string) {
	t.Helper()
	req := cel.CreateAdmissionRequest(va.Attributes, metav1.GroupVersionResource(res), metav1.GroupVersionKind(va.VersionedKind))
	eval := func(c cel.ConditionEvaluator) []cel.EvaluationResult {
		rs, _, err := c.ForInput(context.Background(), va, req, cel.OptionalVariableBindings{}, ns, 1e7)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	for _, m := range eval(p.match) {
		if m.Error != nil {
			t.Fatalf("match condition: %v", m.Error)
		}
		if m.EvalResult.Value() != true {
			return true, nil // not this policy's identity
		}
	}
	allowed = true
	for i, r := range eval(p.validate) {
		switch {
		case r.Error != nil:
			allowed, why = false, append(why, "error: "+r.Error.Error())
		case r.EvalResult.Value() != true:
			allowed, why = false, append(why, r.ExpressionAccessor.GetExpression())
			if p.messages[i] == nil {
				continue
			}
			for _, m := range eval(p.messages[i]) {
				if m.Error != nil {
					t.Fatalf("messageExpression of %q: %v", r.ExpressionAccessor.GetExpression(), m.Error)
				}
				why = append(why, fmt.Sprint(m.EvalResult.Value()))
			}
		}
	}
	return allowed, why
}

// TestAdmissionPolicyDecisions: admission.yaml's policies and the home-lab
// example's village-lan-services, compiled and evaluated by the API
// server's own CEL admission code, allow what the agent and the LAN pool
// store do and deny what they must not. (An empty
// field of the request, no subResource or no extra, is absent to CEL: the
// policies must say has(), which this test caught.) test/kube's
// LeastPrivilege asks a real API server.
func TestAdmissionPolicyDecisions(t *testing.T) {
	o := load(t)
	policies := map[string]compiledPolicy{}
	for _, p := range o.policies {
		policies[p.Name] = compilePolicy(t, p)
	}
	// village-lan-services of the home-lab example, with an IPv6 range
	// beside its IPv4 one (as "services.ranges" may have), across a
	// 16-bit boundary.
	lanSvc := lanServicesPolicy(t)
	setRanges(t, lanSvc, "[['192.168.50.240', '192.168.50.250'], ['fd00:50::fff0', 'fd00:50::1:f']]")
	policies[lanSvc.Name] = compilePolicy(t, lanSvc)
	obj := func(apiVersion, kind, name string, fields map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{"name": name, "namespace": "ns"}}}
		for k, v := range fields {
			if k == "annotations" || k == "labels" {
				u.Object["metadata"].(map[string]any)[k] = v
				continue
			}
			u.Object[k] = v
		}
		return u
	}
	status := map[string]any{"addresses": []any{map[string]any{"type": "InternalIP", "address": "10.1.1.1"}}}
	node := func(name string, ann map[string]any, more ...map[string]any) *unstructured.Unstructured {
		f := map[string]any{"spec": map[string]any{"podCIDR": "10.0.0.0/24"}, "status": status}
		if ann != nil {
			f["annotations"] = ann
		}
		for _, m := range more {
			for k, v := range m {
				f[k] = v
			}
		}
		return obj("v1", "Node", name, f)
	}
	pod := func(nodeName, image string, more ...map[string]any) *unstructured.Unstructured {
		f := map[string]any{"spec": map[string]any{"nodeName": nodeName, "containers": []any{map[string]any{"name": "c", "image": image}}},
			"status": map[string]any{"phase": "Running"}}
		for _, m := range more {
			for k, v := range m {
				f[k] = v
			}
		}
		return obj("v1", "Pod", "p", f)
	}
	lb := func(ingress string, more ...map[string]any) *unstructured.Unstructured {
		st := map[string]any{"loadBalancer": map[string]any{}}
		if ingress != "" {
			st["loadBalancer"] = map[string]any{"ingress": []any{map[string]any{"ip": ingress, "ipMode": "VIP"}}}
		}
		f := map[string]any{"spec": map[string]any{"type": "LoadBalancer", "ports": []any{map[string]any{"port": int64(80)}}}, "status": st}
		for _, m := range more {
			for k, v := range m {
				f[k] = v
			}
		}
		return obj("v1", "Service", "web", f)
	}
	// lbIngress is a Service whose status holds these ingress entries
	// (an IP, or "hostname:" and a name).
	lbIngress := func(entries ...string) *unstructured.Unstructured {
		in := []any{}
		for _, e := range entries {
			if h, ok := strings.CutPrefix(e, "hostname:"); ok {
				in = append(in, map[string]any{"hostname": h})
				continue
			}
			in = append(in, map[string]any{"ip": e, "ipMode": "VIP"})
		}
		return lb("", map[string]any{"status": map[string]any{"loadBalancer": map[string]any{"ingress": in}}})
	}
	// event is a core Event in namespace ns about kind/involvedNS/name,
	// reported as component from host (source and reporting instance,
	// as client-go's recorder writes them).
	event := func(ns, kind, apiVersion, involvedNS, name, component, host string) *unstructured.Unstructured {
		u := obj("v1", "Event", "e1", map[string]any{
			"involvedObject":     map[string]any{"kind": kind, "apiVersion": apiVersion, "namespace": involvedNS, "name": name, "uid": "u"},
			"reason":             "LANAddressTaken",
			"message":            "m",
			"type":               "Warning",
			"count":              int64(1),
			"source":             map[string]any{"component": component, "host": host},
			"reportingComponent": component,
			"reportingInstance":  host,
		})
		u.SetNamespace(ns)
		if involvedNS == "" {
			unstructured.RemoveNestedField(u.Object, "involvedObject", "namespace")
		}
		return u
	}
	podEvent := func(host string) *unstructured.Unstructured {
		return event("ns", "Pod", "v1", "ns", "p", "villaged", host)
	}
	withField := func(u *unstructured.Unstructured, value any, path ...string) *unstructured.Unstructured {
		u = u.DeepCopy()
		if err := unstructured.SetNestedField(u.Object, value, path...); err != nil {
			t.Fatal(err)
		}
		return u
	}
	lease := func(name string) *unstructured.Unstructured { return obj("coordination.k8s.io/v1", "Lease", name, nil) }
	// addrLease is an address's Lease as pkg/ipam/store/kube writes it,
	// naming holder as its node; marker a "last reserved" marker.
	addrLease := func(name, holder string) *unstructured.Unstructured {
		return obj("coordination.k8s.io/v1", "Lease", name, map[string]any{
			"labels":      map[string]any{"village.cni.io/ipam-kind": "address"},
			"annotations": map[string]any{"village.cni.io/ipam-node": holder},
			"spec":        map[string]any{"holderIdentity": holder}})
	}
	marker := func(name string) *unstructured.Unstructured {
		return obj("coordination.k8s.io/v1", "Lease", name, map[string]any{
			"labels": map[string]any{"village.cni.io/ipam-kind": "last"}, "spec": map[string]any{"holderIdentity": "192.0.2.5"}})
	}
	// token is a TokenRequest bound to boundTo's object named name (the
	// API server has filled in its audiences, defaulted or asked for).
	token := func(boundTo, name string, life int64, audiences ...string) *unstructured.Unstructured {
		if len(audiences) == 0 {
			audiences = []string{"https://kubernetes.default.svc"}
		}
		auds := make([]any, len(audiences))
		for i, a := range audiences {
			auds[i] = a
		}
		spec := map[string]any{"expirationSeconds": life, "audiences": auds}
		if boundTo != "" {
			spec["boundObjectRef"] = map[string]any{"kind": boundTo, "apiVersion": "v1", "name": name, "uid": "u"}
		}
		return obj("authentication.k8s.io/v1", "TokenRequest", "village-ipam", map[string]any{"spec": spec})
	}
	const (
		agentUser = "system:serviceaccount:kube-system:village"
		ipamUser  = "system:serviceaccount:kube-system:village-ipam"
		claim     = "authentication.kubernetes.io/node-name"
	)
	onNode1 := map[string][]string{claim: {"n1"}}
	agent := &user.DefaultInfo{Name: agentUser, Extra: onNode1}
	unbound := &user.DefaultInfo{Name: agentUser}
	ipam := &user.DefaultInfo{Name: ipamUser, Extra: onNode1}
	ipamUnbound := &user.DefaultInfo{Name: ipamUser}
	kubelet := &user.DefaultInfo{Name: "system:node:n2"}
	ann := map[string]any{"village.cni.io/underlay-ip": "10.1.1.1", "example.com/x": "1"}
	ann2 := map[string]any{"village.cni.io/underlay-ip": "10.1.1.2", "example.com/x": "1"}
	nodes := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	leases := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	sas := schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	services := schema.GroupVersionResource{Version: "v1", Resource: "services"}
	events := schema.GroupVersionResource{Version: "v1", Resource: "events"}
	eventsV1 := schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}
	announcer := map[string]any{"annotations": map[string]any{"village.cni.io/lan-announcer": "n1"}}
	lanClass := map[string]any{"spec": map[string]any{"type": "LoadBalancer", "loadBalancerClass": "village.cni.io/lan", "ports": []any{map[string]any{"port": int64(80)}}}}
	otherClass := map[string]any{"spec": map[string]any{"type": "LoadBalancer", "loadBalancerClass": "example.com/other-lb", "ports": []any{map[string]any{"port": int64(80)}}}}
	externalIPs := map[string]any{"spec": map[string]any{"type": "LoadBalancer", "externalIPs": []any{"8.8.8.8"}, "ports": []any{map[string]any{"port": int64(80)}}}}
	const closedNS = "Service of a namespace not allowed,"
	conditions := map[string]any{"status": map[string]any{"loadBalancer": map[string]any{"ingress": []any{map[string]any{"ip": "192.0.2.9"}}}, "conditions": []any{map[string]any{"type": "x", "status": "True"}}}}
	for _, tc := range []struct {
		name, policy string
		obj, old     *unstructured.Unstructured
		res          schema.GroupVersionResource
		sub          string
		op           admission.Operation
		u            user.Info
		allow        bool
	}{
		{"own Node, Village annotation changed", "village-agent", node("n1", ann2), node("n1", ann), nodes, "status", admission.Update, agent, true},
		{"own Node, first Village annotation", "village-agent", node("n1", map[string]any{"village.cni.io/underlay-ip": "1"}), node("n1", nil), nodes, "status", admission.Update, agent, true},
		{"own Node, Village annotation removed", "village-agent", node("n1", map[string]any{"example.com/x": "1"}), node("n1", ann), nodes, "status", admission.Update, agent, true},
		{"own Node, its gossip address and LAN MAC", "village-agent", node("n1", map[string]any{"village.cni.io/lan-member": "192.0.2.11:7947", "village.cni.io/lan-mac": "02:00:00:00:00:11"}), node("n1", nil), nodes, "status", admission.Update, agent, true},
		{"another Node, its LAN MAC", "village-agent", node("n2", map[string]any{"village.cni.io/lan-mac": "02:00:00:00:00:11"}), node("n2", nil), nodes, "status", admission.Update, agent, false},
		{"another Node, Village annotation", "village-agent", node("n2", ann2), node("n2", ann), nodes, "status", admission.Update, agent, false},
		{"another Node through nodes", "village-agent", node("n2", ann2), node("n2", ann), nodes, "", admission.Update, agent, false},
		{"own Node, foreign annotation changed", "village-agent", node("n1", map[string]any{"village.cni.io/underlay-ip": "10.1.1.1", "example.com/x": "2"}), node("n1", ann), nodes, "status", admission.Update, agent, false},
		{"own Node, foreign annotation removed", "village-agent", node("n1", map[string]any{"village.cni.io/underlay-ip": "10.1.1.1"}), node("n1", ann), nodes, "status", admission.Update, agent, false},
		{"own Node, label", "village-agent", node("n1", ann, map[string]any{"labels": map[string]any{"a": "b"}}), node("n1", ann), nodes, "status", admission.Update, agent, false},
		{"own Node, status", "village-agent", node("n1", ann, map[string]any{"status": map[string]any{}}), node("n1", ann), nodes, "status", admission.Update, agent, false},
		{"own Node, taint", "village-agent", node("n1", ann, map[string]any{"spec": map[string]any{"taints": []any{map[string]any{"key": "x", "effect": "NoSchedule"}}}}), node("n1", ann), nodes, "", admission.Update, agent, false},
		{"own Node, token naming no node", "village-agent", node("n1", ann2), node("n1", ann), nodes, "status", admission.Update, unbound, false},
		{"own node's pod, Village annotation", "village-agent", pod("n1", "img", map[string]any{"annotations": map[string]any{"village.cni.io/lan-address": "net1=192.0.2.5/24"}}), pod("n1", "img"), pods, "", admission.Update, agent, true},
		{"another node's pod, Village annotation", "village-agent", pod("n2", "img", map[string]any{"annotations": map[string]any{"village.cni.io/lan-address": "x"}}), pod("n2", "img"), pods, "", admission.Update, agent, false},
		{"own node's pod, image", "village-agent", pod("n1", "evil"), pod("n1", "img"), pods, "", admission.Update, agent, false},
		{"own node's pod, label", "village-agent", pod("n1", "img", map[string]any{"labels": map[string]any{"app": "x"}}), pod("n1", "img"), pods, "", admission.Update, agent, false},
		{"own node's pod, foreign annotation", "village-agent", pod("n1", "img", map[string]any{"annotations": map[string]any{"example.com/x": "1"}}), pod("n1", "img"), pods, "", admission.Update, agent, false},
		{"own node's pod, status", "village-agent", pod("n1", "img", map[string]any{"status": map[string]any{"phase": "Failed"}}), pod("n1", "img"), pods, "status", admission.Update, agent, false},
		{"own node's pod, ephemeral container", "village-agent", pod("n1", "img"), pod("n1", "img"), pods, "ephemeralcontainers", admission.Update, agent, false},
		{"own node's pod, delete", "village-agent", nil, pod("n1", "img"), pods, "", admission.Delete, agent, false},
		{"own node's pod, eviction", "village-agent", pod("n1", "img"), nil, pods, "eviction", admission.Create, agent, false},
		{"Service, LAN address in the status", "village-agent", lb("192.0.2.9"), lb(""), services, "status", admission.Update, agent, true},
		{"Service, LAN address cleared", "village-agent", lb(""), lb("192.0.2.9"), services, "status", admission.Update, agent, true},
		{"Service, announcer annotation", "village-agent", lb("192.0.2.9", announcer), lb("192.0.2.9"), services, "", admission.Update, agent, true},
		{"Service, status through the main resource", "village-agent", lb("192.0.2.10"), lb("192.0.2.9"), services, "", admission.Update, agent, false},
		{"Service, status conditions", "village-agent", lb("192.0.2.9", conditions), lb("192.0.2.9"), services, "status", admission.Update, agent, false},
		{"Service, spec", "village-agent", lb("", map[string]any{"spec": map[string]any{"type": "NodePort"}}), lb(""), services, "", admission.Update, agent, false},
		{"Service, foreign annotation", "village-agent", lb("", map[string]any{"annotations": map[string]any{"example.com/x": "1"}}), lb(""), services, "", admission.Update, agent, false},
		{"Service, label", "village-agent", lb("", map[string]any{"labels": map[string]any{"a": "b"}}), lb(""), services, "", admission.Update, agent, false},
		{"Service, delete", "village-agent", nil, lb(""), services, "", admission.Delete, agent, false},
		{"Service, token naming no node", "village-agent", lb("192.0.2.9"), lb(""), services, "status", admission.Update, unbound, false},
		{"Service of class village.cni.io/lan, LAN address", "village-agent", lb("192.0.2.9", lanClass), lb("", lanClass), services, "status", admission.Update, agent, true},
		{"Service of another class, ingress 8.8.8.8", "village-agent", lb("8.8.8.8", otherClass), lb("", otherClass), services, "status", admission.Update, agent, false},
		{"Service of another class, announcer annotation", "village-agent", lb("", otherClass, announcer), lb("", otherClass), services, "", admission.Update, agent, false},
		{closedNS + " ingress 8.8.8.8", "village-agent", lb("8.8.8.8"), lb(""), services, "status", admission.Update, agent, false},
		{closedNS + " announcer annotation", "village-agent", lb("", announcer), lb(""), services, "", admission.Update, agent, false},
		{closedNS + " LAN address removed", "village-agent", lb(""), lb("192.0.2.9"), services, "status", admission.Update, agent, true},
		{closedNS + " announcer removed", "village-agent", lb("192.0.2.9"), lb("192.0.2.9", announcer), services, "", admission.Update, agent, true},
		{"Service, spec.externalIPs 8.8.8.8", "village-agent", lb("", externalIPs), lb(""), services, "", admission.Update, agent, false},
		{"Service, spec.externalIPs through services/status", "village-agent", lb("", externalIPs), lb(""), services, "status", admission.Update, agent, false},
		{"LAN Service range: its first address", "village-lan-services", lbIngress("192.168.50.240"), lbIngress(), services, "status", admission.Update, agent, true},
		{"LAN Service range: an address inside", "village-lan-services", lbIngress("192.168.50.245"), lbIngress(), services, "status", admission.Update, agent, true},
		{"LAN Service range: its last address", "village-lan-services", lbIngress("192.168.50.250"), lbIngress(), services, "status", admission.Update, agent, true},
		{"LAN Service range: IPv6 across a 16-bit boundary", "village-lan-services", lbIngress("fd00:50::fff7", "fd00:50::1:0", "fd00:50::1:f"), lbIngress(), services, "status", admission.Update, agent, true},
		{"LAN Service range: both families", "village-lan-services", lbIngress("192.168.50.241", "fd00:50::fff0"), lbIngress(), services, "status", admission.Update, agent, true},
		{"LAN Service range: another load balancer's address kept", "village-lan-services", lbIngress("203.0.113.7", "192.168.50.241"), lbIngress("203.0.113.7"), services, "status", admission.Update, agent, true},
		{"LAN Service range: address removed", "village-lan-services", lbIngress(), lbIngress("192.168.50.241"), services, "status", admission.Update, agent, true},
		{"LAN Service range: annotation only", "village-lan-services", lbIngress("192.168.50.241"), lbIngress("192.168.50.241"), services, "", admission.Update, agent, true},
		{"LAN Service range: 8.8.8.8", "village-lan-services", lbIngress("8.8.8.8"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: the router 192.168.50.1", "village-lan-services", lbIngress("192.168.50.1"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: one below", "village-lan-services", lbIngress("192.168.50.239"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: one above", "village-lan-services", lbIngress("192.168.50.251"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: same host part, other subnet", "village-lan-services", lbIngress("192.168.51.245"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: IPv6 one below", "village-lan-services", lbIngress("fd00:50::ffef"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: IPv6 one above", "village-lan-services", lbIngress("fd00:50::1:10"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: IPv6 of another prefix", "village-lan-services", lbIngress("fd01:50::fff7"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: IPv4-mapped IPv6 of an address inside", "village-lan-services", lbIngress("::ffff:192.168.50.245"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: one inside, 8.8.8.8 added beside", "village-lan-services", lbIngress("192.168.50.241", "8.8.8.8"), lbIngress("192.168.50.241"), services, "status", admission.Update, agent, false},
		{"LAN Service range: a hostname", "village-lan-services", lbIngress("hostname:evil.example.com"), lbIngress(), services, "status", admission.Update, agent, false},
		{"LAN Service range: through the main resource", "village-lan-services", lbIngress("8.8.8.8"), lbIngress(), services, "", admission.Update, agent, false},
		{"LAN Service range: not the agent", "village-lan-services", lbIngress("8.8.8.8"), lbIngress(), services, "status", admission.Update, kubelet, true},
		{"Event about a pod of its namespace", "village-events", podEvent("n1"), nil, events, "", admission.Create, agent, true},
		{"Event about a Service", "village-events", event("ns", "Service", "v1", "ns", "web", "villaged", "n1"), nil, events, "", admission.Create, agent, true},
		{"Event about a NetworkPolicy", "village-events", event("ns", "NetworkPolicy", "networking.k8s.io/v1", "ns", "np", "villaged", "n1"), nil, events, "", admission.Create, agent, true},
		{"Event about its own Node in default", "village-events", event("default", "Node", "", "", "n1", "villaged", "n1"), nil, events, "", admission.Create, agent, true},
		{"Event patched (count) by its reporter", "village-events", withField(podEvent("n1"), int64(2), "count"), podEvent("n1"), events, "", admission.Update, agent, true},
		{"Event about a pod of another namespace", "village-events", event("ns", "Pod", "v1", "kube-system", "p", "villaged", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event about a Secret", "village-events", event("ns", "Secret", "v1", "ns", "s", "villaged", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event about a Deployment", "village-events", event("ns", "Deployment", "apps/v1", "ns", "d", "villaged", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event about a Pod of another API group", "village-events", event("ns", "Pod", "example.com/v1", "ns", "p", "villaged", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event about another Node", "village-events", event("default", "Node", "", "", "n2", "villaged", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event about its own Node outside default", "village-events", event("ns", "Node", "", "", "n1", "villaged", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event reported from another node", "village-events", podEvent("n2"), nil, events, "", admission.Create, agent, false},
		{"Event with another reporting instance", "village-events", withField(podEvent("n1"), "n2", "reportingInstance"), nil, events, "", admission.Create, agent, false},
		{"Event posing as the kubelet", "village-events", event("ns", "Pod", "v1", "ns", "p", "kubelet", "n1"), nil, events, "", admission.Create, agent, false},
		{"Event by a token naming no node", "village-events", podEvent("n1"), nil, events, "", admission.Create, unbound, false},
		{"Event of another reporter patched", "village-events", withField(podEvent("n1"), "m2", "message"), event("ns", "Pod", "v1", "ns", "p", "kubelet", "n2"), events, "", admission.Update, agent, false},
		{"Event patched to another object", "village-events", withField(podEvent("n1"), "q", "involvedObject", "name"), podEvent("n1"), events, "", admission.Update, agent, false},
		{"Event deleted", "village-events", nil, podEvent("n1"), events, "", admission.Delete, agent, false},
		{"Event through events.k8s.io", "village-events", podEvent("n1"), nil, eventsV1, "", admission.Create, agent, false},
		{"a kubelet's Event is not the agent's", "village-events", event("ns", "Pod", "v1", "ns", "p", "kubelet", "n2"), nil, events, "", admission.Create, kubelet, true},
		{"a kubelet is not the agent", "village-agent", node("n2", ann2), node("n2", ann), nodes, "status", admission.Update, kubelet, true},
		{"pool Lease created", "village-ipam", addrLease("village-ipam-0123-192.0.2.5", "n1"), nil, leases, "", admission.Create, ipam, true},
		{"pool Lease naming another node created", "village-ipam", addrLease("village-ipam-0123-192.0.2.5", "n2"), nil, leases, "", admission.Create, ipam, false},
		{"pool Lease naming no node created", "village-ipam", lease("village-ipam-0123-192.0.2.5"), nil, leases, "", admission.Create, ipam, false},
		{"pool Lease created by a token naming no node", "village-ipam", addrLease("village-ipam-0123-192.0.2.5", "n1"), nil, leases, "", admission.Create, ipamUnbound, false},
		{"another node's pool Lease taken over", "village-ipam", addrLease("village-ipam-0123-192.0.2.5", "n1"), addrLease("village-ipam-0123-192.0.2.5", "n2"), leases, "", admission.Update, ipam, false},
		{"an address Lease disguised as a marker", "village-ipam", marker("village-ipam-0123-192.0.2.5"), nil, leases, "", admission.Create, ipam, false},
		{"marker created", "village-ipam", marker("village-ipam-0123-last-0"), nil, leases, "", admission.Create, ipam, true},
		{"marker updated", "village-ipam", marker("village-ipam-0123-last-0"), marker("village-ipam-0123-last-0"), leases, "", admission.Update, ipam, true},
		{"pool Lease deleted", "village-ipam", nil, addrLease("village-ipam-0123-192.0.2.5", "n1"), leases, "", admission.Delete, ipam, true},
		{"another node's pool Lease deleted (GC of a deleted Node)", "village-ipam", nil, addrLease("village-ipam-0123-192.0.2.5", "n2"), leases, "", admission.Delete, ipam, true},
		{"kube-scheduler Lease created", "village-ipam", lease("kube-scheduler"), nil, leases, "", admission.Create, ipam, false},
		{"kube-controller-manager Lease updated", "village-ipam", lease("kube-controller-manager"), lease("kube-controller-manager"), leases, "", admission.Update, ipam, false},
		{"kube-controller-manager Lease deleted", "village-ipam", nil, lease("kube-controller-manager"), leases, "", admission.Delete, ipam, false},
		{"token bound to its own Node, an hour", "village-token", token("Node", "n1", 3600), nil, sas, "token", admission.Create, agent, true},
		{"token bound to its own Node, k3s's audiences", "village-token", token("Node", "n1", 3600, "https://kubernetes.default.svc.cluster.local", "k3s"), nil, sas, "token", admission.Create, agent, true},
		{"token bound to another Node", "village-token", token("Node", "n2", 3600), nil, sas, "token", admission.Create, agent, false},
		{"token bound to its own Node by a token naming no node", "village-token", token("Node", "n1", 3600), nil, sas, "token", admission.Create, unbound, false},
		{"token for a custom audience", "village-token", token("Node", "n1", 3600, "vault"), nil, sas, "token", admission.Create, agent, false},
		{"token for the API server and a custom audience", "village-token", token("Node", "n1", 3600, "https://kubernetes.default.svc", "vault"), nil, sas, "token", admission.Create, agent, false},
		{"token bound to a Pod", "village-token", token("Pod", "n1", 3600), nil, sas, "token", admission.Create, agent, false},
		{"token bound to a Secret", "village-token", token("Secret", "n1", 3600), nil, sas, "token", admission.Create, agent, false},
		{"token bound to nothing", "village-token", token("", "", 3600), nil, sas, "token", admission.Create, agent, false},
		{"token for a day", "village-token", token("Node", "n1", 86400), nil, sas, "token", admission.Create, agent, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := policies[tc.policy]
			if !ok {
				t.Fatalf("no policy %s", tc.policy)
			}
			name := ""
			va := &admission.VersionedAttributes{}
			for _, u := range []*unstructured.Unstructured{tc.old, tc.obj} {
				if u != nil {
					name, va.VersionedKind = u.GetName(), u.GroupVersionKind()
				}
			}
			if tc.obj != nil {
				va.VersionedObject = admission.NewLazyObject(tc.obj)
			}
			if tc.old != nil {
				va.VersionedOldObject = admission.NewLazyObject(tc.old)
			}
			namespace := "ns"
			for _, u := range []*unstructured.Unstructured{tc.old, tc.obj} {
				if u != nil {
					namespace = u.GetNamespace()
				}
			}
			va.Attributes = admission.NewAttributesRecord(nil, nil, va.VersionedKind, namespace, name, tc.res, tc.sub, tc.op, nil, false, tc.u)
			// The namespace as the API server hands it to the policy
			// (namespaceObject).
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{"village.cni.io/lan": "allowed"}}}
			if strings.HasPrefix(tc.name, closedNS) { // not labelled village.cni.io/lan=allowed
				ns.Labels = map[string]string{"kubernetes.io/metadata.name": namespace}
			}
			allowed, why := p.decide(t, va, tc.res, ns)
			if allowed != tc.allow {
				t.Errorf("%s: allowed %v, want %v (failed: %q)", tc.policy, allowed, tc.allow, why)
			}
			if !allowed {
				t.Logf("denied: %q", why)
			}
		})
	}
}
