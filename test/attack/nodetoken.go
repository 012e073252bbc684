package attack

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/village-cni/village/internal/kubecluster"
	kubestore "github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/kubenames"
)

// NodeTokenTargets is what NodeTokenWrites attacks on a cluster running LAN
// Services: the token's own node and another one, the namespace labelled
// village.cni.io/lan=allowed holding Village's LoadBalancer Service web,
// a pod there bound to the other node, and the LAN's router.
type NodeTokenTargets struct {
	Node, OtherNode string
	AllowedNS       string
	OtherPod        string // a pod of AllowedNS on OtherNode
	Router          string // an address of the LAN outside the Service ranges
}

// NodeTokenWrites attacks with a stolen node token (agent: a client with the
// agent's own projected token, read from its node) every write it might
// try beyond its node's own business: another Node's status and labels, a
// pod on another node, a Service status address outside the LAN Service
// ranges or a hostname, spec.externalIPs, another node's LAN pool Lease
// (with the village-ipam token it may mint), Events in a namespace or
// about an object not its own or posing as another reporter, Secrets, and
// tokens for another node, another audience, a day or another account.
// Each must be refused by the API server (Forbidden: RBAC, or the named
// ValidatingAdmissionPolicy of deploy/kubernetes/admission.yaml or
// examples/homelab/lan-services.yaml); each refusal is logged. The agent's
// own Event and its own token still pass.
func NodeTokenWrites(t *testing.T, c *kubecluster.Cluster, agent kubernetes.Interface, w NodeTokenTargets) {
	ctx := context.Background()
	admin := c.Client()
	own, err := admin.CoreV1().Nodes().Get(ctx, w.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := admin.CoreV1().Nodes().Get(ctx, w.OtherNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := admin.CoreV1().Pods(w.AllowedNS).Get(ctx, w.OtherPod, metav1.GetOptions{})
	if err != nil || pod.Spec.NodeName != w.OtherNode {
		t.Fatalf("pod %s/%s on %s (%v), want it on %s", w.AllowedNS, w.OtherPod, pod.Spec.NodeName, err, w.OtherNode)
	}

	// Another node's address Lease of the LAN pool, as
	// pkg/ipam/store/kube writes it.
	leaseName := kubestore.LeasePrefix + "attack-" + w.OtherNode
	otherLease := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: kubecluster.VillageNamespace,
		Labels:          map[string]string{kubenames.LabelIPAMKind: "address"},
		Annotations:     map[string]string{kubenames.AnnotationIPAMNode: w.OtherNode},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: other.Name, UID: other.UID}}},
		Spec: coordv1.LeaseSpec{HolderIdentity: &w.OtherNode}}
	if _, err := admin.CoordinationV1().Leases(kubecluster.VillageNamespace).Create(ctx, otherLease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("Lease %s: %v", leaseName, err)
	}
	t.Cleanup(func() {
		_ = admin.CoordinationV1().Leases(kubecluster.VillageNamespace).Delete(context.Background(), leaseName, metav1.DeleteOptions{})
	})
	// The kubelet's Event about that pod, in its namespace.
	kubeletEvent := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "attack-kubelet-"},
		InvolvedObject: podRef(pod), Reason: "Pulled", Message: "Container image pulled", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "kubelet", Host: w.OtherNode}, ReportingController: "kubelet", ReportingInstance: w.OtherNode,
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
	kubeletEvent, err = admin.CoreV1().Events(w.AllowedNS).Create(ctx, kubeletEvent, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// What the agent may do, done first: an attack refused only because
	// the token is broken proves nothing.
	mint := func(account string, spec authv1.TokenRequestSpec) (string, error) {
		tr, err := agent.CoreV1().ServiceAccounts(kubecluster.VillageNamespace).CreateToken(ctx, account, &authv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		return tr.Status.Token, nil
	}
	hour, day := int64(3600), int64(86400)
	bound := func(n *corev1.Node) *authv1.BoundObjectReference {
		return &authv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.UID}
	}
	tok, err := mint("village-ipam", authv1.TokenRequestSpec{ExpirationSeconds: &hour, BoundObjectRef: bound(own)})
	if err != nil {
		t.Fatalf("the agent of %s cannot mint its own village-ipam token (pkg/agent hostcreds does): %v", w.Node, err)
	}
	ipam := tokenClient(t, c, tok)
	agentEvent := func(ns string, about corev1.ObjectReference) *corev1.Event {
		now := metav1.Now()
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "attack-"}, InvolvedObject: about,
			Reason: kubenames.ReasonLANAssigned, Message: "attack", Type: corev1.EventTypeNormal,
			Source:         corev1.EventSource{Component: kubenames.Agent, Host: w.Node},
			FirstTimestamp: now, LastTimestamp: now, Count: 1, ReportingController: kubenames.Agent, ReportingInstance: w.Node}
	}
	// A new-style Event (eventTime set): the API server's validation then
	// no longer ties its namespace to its object's.
	newStyle := func(e *corev1.Event) *corev1.Event {
		e.EventTime, e.Action, e.FirstTimestamp, e.LastTimestamp, e.Count = metav1.NowMicro(), "Assign", metav1.Time{}, metav1.Time{}, 0
		return e
	}
	legit, err := agent.CoreV1().Events(w.AllowedNS).Create(ctx, agentEvent(w.AllowedNS, podRef(pod)), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the agent of %s cannot report an Event about pod %s/%s as villaged on its node: %v", w.Node, w.AllowedNS, w.OtherPod, err)
	}
	_ = admin.CoreV1().Events(w.AllowedNS).Delete(ctx, legit.Name, metav1.DeleteOptions{})

	// takeOver rewrites the other node's Lease as the token's node's,
	// through cs.
	takeOver := func(cs kubernetes.Interface) error {
		l, err := admin.CoordinationV1().Leases(kubecluster.VillageNamespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil {
			return errors.New("admin: " + err.Error()) // not a refusal: fails the test
		}
		l.Spec.HolderIdentity = &w.Node
		l.Annotations[kubenames.AnnotationIPAMNode] = w.Node
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: own.Name, UID: own.UID}}
		_, err = cs.CoordinationV1().Leases(kubecluster.VillageNamespace).Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	merge := func(v any) []byte { b, _ := json.Marshal(v); return b }
	ann := func(k, v string) []byte {
		return merge(map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: v}}})
	}
	ingress := func(in map[string]any) []byte {
		return merge(map[string]any{"status": map[string]any{"loadBalancer": map[string]any{"ingress": []any{in}}}})
	}
	secretName := "village-gossip"
	for _, a := range []struct {
		what string
		by   []string // who refuses: a policy's name, or "RBAC"
		do   func() error
	}{
		// Nodes.
		{"annotating another Node through nodes/status (its underlay-ip)", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Nodes().Patch(ctx, w.OtherNode, ktypes.MergePatchType, ann(kubenames.Prefix+"underlay-ip", "192.0.2.66"), metav1.PatchOptions{}, "status")
			return err
		}},
		{"labelling another Node", []string{"RBAC", "village-agent"}, func() error {
			_, err := agent.CoreV1().Nodes().Patch(ctx, w.OtherNode, ktypes.MergePatchType, merge(map[string]any{"metadata": map[string]any{"labels": map[string]any{"attack": "x"}}}), metav1.PatchOptions{})
			return err
		}},
		{"labelling another Node through nodes/status", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Nodes().Patch(ctx, w.OtherNode, ktypes.MergePatchType, merge(map[string]any{"metadata": map[string]any{"labels": map[string]any{"attack": "x"}}}), metav1.PatchOptions{}, "status")
			return err
		}},
		{"marking another Node not ready (status.conditions)", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Nodes().Patch(ctx, w.OtherNode, ktypes.StrategicMergePatchType, merge(map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False"}}}}), metav1.PatchOptions{}, "status")
			return err
		}},
		// A pod on another node.
		{"annotating a pod on another node", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Pods(w.AllowedNS).Patch(ctx, w.OtherPod, ktypes.MergePatchType, ann(kubenames.AnnotationLANAddress, "net1=192.0.2.66/24"), metav1.PatchOptions{})
			return err
		}},
		{"changing the image of a pod on another node", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Pods(w.AllowedNS).Patch(ctx, w.OtherPod, ktypes.StrategicMergePatchType,
				merge(map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": pod.Spec.Containers[0].Name, "image": "registry.example/evil:1"}}}}), metav1.PatchOptions{})
			return err
		}},
		{"relabelling a pod on another node (into another Service's endpoints)", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Pods(w.AllowedNS).Patch(ctx, w.OtherPod, ktypes.MergePatchType, merge(map[string]any{"metadata": map[string]any{"labels": map[string]any{"tier": "attack"}}}), metav1.PatchOptions{})
			return err
		}},
		{"evicting a pod on another node", []string{"RBAC"}, func() error {
			return agent.CoreV1().Pods(w.AllowedNS).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: w.OtherPod, Namespace: w.AllowedNS}})
		}},
		// Services: Village's own Service in an allowed namespace.
		{"ingress 8.8.8.8 on Village's Service web (services/status)", []string{"village-lan-services"}, func() error {
			_, err := agent.CoreV1().Services(w.AllowedNS).Patch(ctx, "web", ktypes.MergePatchType, ingress(map[string]any{"ip": "8.8.8.8", "ipMode": "VIP"}), metav1.PatchOptions{}, "status")
			return err
		}},
		{"ingress " + w.Router + " (the LAN's router) on Village's Service web", []string{"village-lan-services"}, func() error {
			_, err := agent.CoreV1().Services(w.AllowedNS).Patch(ctx, "web", ktypes.MergePatchType, ingress(map[string]any{"ip": w.Router, "ipMode": "VIP"}), metav1.PatchOptions{}, "status")
			return err
		}},
		{"ingress 8.8.8.8 on web by a full status update", []string{"village-lan-services"}, func() error {
			s, err := agent.CoreV1().Services(w.AllowedNS).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return errors.New("get web: " + err.Error()) // not a refusal: fails the test
			}
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: "8.8.8.8"})
			_, err = agent.CoreV1().Services(w.AllowedNS).UpdateStatus(ctx, s, metav1.UpdateOptions{})
			return err
		}},
		{"ingress hostname on Village's Service web (external-dns would publish it)", []string{"village-lan-services"}, func() error {
			_, err := agent.CoreV1().Services(w.AllowedNS).Patch(ctx, "web", ktypes.MergePatchType, ingress(map[string]any{"hostname": "attacker.example.com"}), metav1.PatchOptions{}, "status")
			return err
		}},
		{"spec.externalIPs 8.8.8.8 on Village's Service web", []string{"village-agent"}, func() error {
			_, err := agent.CoreV1().Services(w.AllowedNS).Patch(ctx, "web", ktypes.MergePatchType, merge(map[string]any{"spec": map[string]any{"externalIPs": []string{"8.8.8.8"}}}), metav1.PatchOptions{})
			return err
		}},
		// Another node's LAN pool Lease.
		{"updating another node's pool Lease with the agent's own token", []string{"RBAC"}, func() error { return takeOver(agent) }},
		{"taking over another node's pool Lease with the minted village-ipam token", []string{"village-ipam"}, func() error { return takeOver(ipam) }},
		{"creating a pool Lease in another node's name with the minted token", []string{"village-ipam"}, func() error {
			l := otherLease.DeepCopy()
			l.Name = leaseName + "-2"
			_, err := ipam.CoordinationV1().Leases(kubecluster.VillageNamespace).Create(ctx, l, metav1.CreateOptions{})
			if err == nil {
				_ = admin.CoordinationV1().Leases(kubecluster.VillageNamespace).Delete(ctx, l.Name, metav1.DeleteOptions{})
			}
			return err
		}},
		// Events.
		{"an Event in namespace default about a pod of " + w.AllowedNS, []string{"village-events"}, func() error {
			_, err := agent.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, newStyle(agentEvent(metav1.NamespaceDefault, podRef(pod))), metav1.CreateOptions{})
			return err
		}},
		{"an Event about a Secret", []string{"village-events"}, func() error {
			ref := corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: w.AllowedNS, Name: "db-password"}
			_, err := agent.CoreV1().Events(w.AllowedNS).Create(ctx, agentEvent(w.AllowedNS, ref), metav1.CreateOptions{})
			return err
		}},
		{"an Event about another Node", []string{"village-events"}, func() error {
			ref := corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: w.OtherNode, UID: other.UID}
			_, err := agent.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, agentEvent(metav1.NamespaceDefault, ref), metav1.CreateOptions{})
			return err
		}},
		{"an Event posing as the kubelet of another node", []string{"village-events"}, func() error {
			e := agentEvent(w.AllowedNS, podRef(pod))
			e.Source, e.ReportingController, e.ReportingInstance, e.Reason = corev1.EventSource{Component: "kubelet", Host: w.OtherNode}, "kubelet", w.OtherNode, "Killing"
			_, err := agent.CoreV1().Events(w.AllowedNS).Create(ctx, e, metav1.CreateOptions{})
			return err
		}},
		{"rewriting the kubelet's Event", []string{"village-events"}, func() error {
			_, err := agent.CoreV1().Events(w.AllowedNS).Patch(ctx, kubeletEvent.Name, ktypes.MergePatchType, merge(map[string]any{"message": "attack"}), metav1.PatchOptions{})
			return err
		}},
		{"an Event through events.k8s.io", []string{"RBAC", "village-events"}, func() error {
			_, err := agent.EventsV1().Events(w.AllowedNS).Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "attack-"},
				EventTime: metav1.NowMicro(), ReportingController: kubenames.Agent, ReportingInstance: w.Node, Action: "Assign",
				Reason: "Attack", Type: corev1.EventTypeNormal, Regarding: podRef(pod)}, metav1.CreateOptions{})
			return err
		}},
		// Secrets.
		{"reading Secret kube-system/" + secretName + " (the gossip key)", []string{"RBAC"}, func() error {
			_, err := agent.CoreV1().Secrets(kubecluster.VillageNamespace).Get(ctx, secretName, metav1.GetOptions{})
			return err
		}},
		{"listing Secrets cluster-wide", []string{"RBAC"}, func() error {
			_, err := agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"writing a Secret", []string{"RBAC"}, func() error {
			_, err := agent.CoreV1().Secrets(w.AllowedNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "attack"}}, metav1.CreateOptions{})
			return err
		}},
		// Tokens.
		{"minting a village-ipam token bound to another Node", []string{"village-token"}, func() error {
			_, err := mint("village-ipam", authv1.TokenRequestSpec{ExpirationSeconds: &hour, BoundObjectRef: bound(other)})
			return err
		}},
		{"minting a village-ipam token for another audience", []string{"village-token"}, func() error {
			_, err := mint("village-ipam", authv1.TokenRequestSpec{Audiences: []string{"vault"}, ExpirationSeconds: &hour, BoundObjectRef: bound(own)})
			return err
		}},
		{"minting a village-ipam token for a day", []string{"village-token"}, func() error {
			_, err := mint("village-ipam", authv1.TokenRequestSpec{ExpirationSeconds: &day, BoundObjectRef: bound(own)})
			return err
		}},
		{"minting a village-ipam token bound to nothing", []string{"village-token"}, func() error {
			_, err := mint("village-ipam", authv1.TokenRequestSpec{ExpirationSeconds: &hour})
			return err
		}},
		{"minting a token of its own account", []string{"RBAC"}, func() error {
			_, err := mint("village", authv1.TokenRequestSpec{ExpirationSeconds: &hour, BoundObjectRef: bound(own)})
			return err
		}},
	} {
		err := a.do()
		var st apierrors.APIStatus
		switch {
		case err == nil:
			t.Errorf("ATTACK SUCCEEDED: the agent's token of %s: %s", w.Node, a.what)
		case !apierrors.IsForbidden(err) || !errors.As(err, &st):
			t.Errorf("%s: %v, want a refusal of the API server (403 Forbidden)", a.what, err)
		default:
			msg := st.Status().Message
			if !refusedBy(msg, a.by) {
				t.Errorf("%s: refused, but not by %v: %s", a.what, a.by, msg)
			}
			t.Logf("refused: %s: %d %s: %s", a.what, st.Status().Code, st.Status().Reason, msg)
		}
	}
	// Nothing the attacks aimed at changed.
	if s, err := admin.CoreV1().Services(w.AllowedNS).Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else {
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP == "8.8.8.8" || in.IP == w.Router || in.Hostname != "" {
				t.Errorf("Service %s/web: ingress %+v after the attacks", w.AllowedNS, in)
			}
		}
	}
	if l, err := admin.CoordinationV1().Leases(kubecluster.VillageNamespace).Get(ctx, leaseName, metav1.GetOptions{}); err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != w.OtherNode {
		t.Errorf("Lease %s after the attacks: %+v (%v), want held by %s", leaseName, l.Spec, err, w.OtherNode)
	}
	if e, err := admin.CoreV1().Events(w.AllowedNS).Get(ctx, kubeletEvent.Name, metav1.GetOptions{}); err != nil || e.Message != kubeletEvent.Message {
		t.Errorf("the kubelet's Event after the attacks: %q (%v)", e.Message, err)
	}
}

// refusedBy reports whether an API server refusal message comes from one
// of by: "RBAC" (the authorizer's "cannot <verb> resource") or a
// ValidatingAdmissionPolicy's name.
func refusedBy(msg string, by []string) bool {
	for _, b := range by {
		if b == "RBAC" && strings.Contains(msg, "cannot ") ||
			b != "RBAC" && strings.Contains(msg, "ValidatingAdmissionPolicy '"+b+"'") {
			return true
		}
	}
	return false
}

// podRef is an Event's reference to p, as client-go's recorder makes it.
func podRef(p *corev1.Pod) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}
}

// tokenClient is a client of c's API server authenticated only by token.
func tokenClient(t *testing.T, c *kubecluster.Cluster, token string) kubernetes.Interface {
	t.Helper()
	rc := rest.AnonymousClientConfig(c.API().Config)
	rc.BearerToken = token
	rc.Timeout = time.Minute
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
