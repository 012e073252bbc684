// Package deploy tests the Kubernetes manifests in deploy/kubernetes: every
// document decodes strictly into the typed API objects of k8s.io/api (with
// client-go's scheme), and the fields Village depends on are what they must
// be. The Kubernetes modules are used here only, never by the binaries.
package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/install"
	kubestore "github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netconf"
)

type objects struct {
	daemonSets      []*appsv1.DaemonSet
	configMaps      []*corev1.ConfigMap
	serviceAccounts []*corev1.ServiceAccount
	clusterRoles    []*rbacv1.ClusterRole
	bindings        []*rbacv1.ClusterRoleBinding
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
	policies        []*admissionv1.ValidatingAdmissionPolicy
	policyBindings  []*admissionv1.ValidatingAdmissionPolicyBinding
	all             []runtime.Object
}

func load(t *testing.T) *objects {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	o := &objects{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range decodeAll(t, filepath.Base(f), b) {
			o.all = append(o.all, obj)
			switch v := obj.(type) {
			case *appsv1.DaemonSet:
				o.daemonSets = append(o.daemonSets, v)
			case *corev1.ConfigMap:
				o.configMaps = append(o.configMaps, v)
			case *corev1.ServiceAccount:
				o.serviceAccounts = append(o.serviceAccounts, v)
			case *rbacv1.ClusterRole:
				o.clusterRoles = append(o.clusterRoles, v)
			case *rbacv1.ClusterRoleBinding:
				o.bindings = append(o.bindings, v)
			case *rbacv1.Role:
				o.roles = append(o.roles, v)
			case *rbacv1.RoleBinding:
				o.roleBindings = append(o.roleBindings, v)
			case *admissionv1.ValidatingAdmissionPolicy:
				o.policies = append(o.policies, v)
			case *admissionv1.ValidatingAdmissionPolicyBinding:
				o.policyBindings = append(o.policyBindings, v)
			default:
				t.Errorf("%s: unexpected kind %s", filepath.Base(f), obj.GetObjectKind().GroupVersionKind())
			}
		}
	}
	// The agent's identity and the host-side IPAM helper's (village-ipam):
	// two of each account and role, one DaemonSet and ConfigMap.
	if len(o.daemonSets) != 1 || len(o.configMaps) != 1 || len(o.serviceAccounts) != 2 || len(o.clusterRoles) != 2 || len(o.bindings) != 2 ||
		len(o.roles) != 2 || len(o.roleBindings) != 2 {
		t.Fatalf("want one DaemonSet and ConfigMap, two ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles and RoleBindings; got %d, %d, %d, %d, %d, %d, %d",
			len(o.daemonSets), len(o.configMaps), len(o.serviceAccounts), len(o.clusterRoles), len(o.bindings), len(o.roles), len(o.roleBindings))
	}
	// The agent's objects first (named village), so index 0 is the agent's.
	slices.SortFunc(o.serviceAccounts, func(a, b *corev1.ServiceAccount) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(o.clusterRoles, func(a, b *rbacv1.ClusterRole) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(o.bindings, func(a, b *rbacv1.ClusterRoleBinding) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(o.roles, func(a, b *rbacv1.Role) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(o.roleBindings, func(a, b *rbacv1.RoleBinding) int { return strings.Compare(a.Name, b.Name) })
	return o
}

// decodeAll decodes every non-empty document of a YAML stream strictly into
// the typed API objects: a misspelt or misplaced field is an error, not
// silently dropped.
func decodeAll(t *testing.T, name string, b []byte) []runtime.Object {
	t.Helper()
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var out []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s document %d does not decode into a Kubernetes API object: %v", name, i, err)
		}
		out = append(out, obj)
	}
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// hostMount returns the host path behind the volume mounted at mountPath.
func hostMount(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, mountPath string) (host string, readOnly bool) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != mountPath {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name {
				if v.HostPath == nil {
					t.Fatalf("%s: %s is mounted from volume %s, which is not a hostPath", c.Name, mountPath, v.Name)
				}
				return filepath.Join(v.HostPath.Path, m.SubPath), m.ReadOnly
			}
		}
		t.Fatalf("%s: mount %s names a missing volume %s", c.Name, mountPath, m.Name)
	}
	t.Fatalf("%s: nothing mounted at %s", c.Name, mountPath)
	return "", false
}

func TestDaemonSet(t *testing.T) {
	o := load(t)
	ds := o.daemonSets[0]
	spec := &ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("hostNetwork must be true: the agent configures the node's own network")
	}
	if ds.Namespace != "kube-system" || spec.PriorityClassName != "system-node-critical" {
		t.Errorf("namespace %q priority %q", ds.Namespace, spec.PriorityClassName)
	}
	if sel := ds.Spec.Selector.MatchLabels; len(sel) == 0 || !subset(sel, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not match the template labels %v", sel, ds.Spec.Template.Labels)
	}
	// Runs on every node: control plane, tainted, and not-ready ones.
	for _, taint := range []corev1.Taint{
		{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
		{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute},
		{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule},
		{Key: "node.kubernetes.io/network-unavailable", Effect: corev1.TaintEffectNoSchedule},
		{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute},
		{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule},
	} {
		if !tolerated(spec.Tolerations, &taint) {
			t.Errorf("the DaemonSet does not tolerate %s", taint.ToString())
		}
	}

	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("want one init container and one container, got %d and %d", len(spec.InitContainers), len(spec.Containers))
	}
	inst := container(t, spec.InitContainers, "install")
	agent := container(t, spec.Containers, "agent")
	for _, c := range []*corev1.Container{inst, agent} {
		// The image `./build_linux.sh image` builds (and test/runtime runs).
		if c.Image != buildinfo.Image || strings.HasSuffix(c.Image, ":latest") {
			t.Errorf("%s: image %q: want %s, the image ./build_linux.sh image builds, at a pinned tag", c.Name, c.Image, buildinfo.Image)
		}
		sc := c.SecurityContext
		if sc == nil || (sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("%s: must not be privileged", c.Name)
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: must drop ALL capabilities", c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s: resource requests missing: %v", c.Name, c.Resources.Requests)
		}
	}
	if inst.Image != agent.Image {
		t.Errorf("init and agent images differ: %s vs %s", inst.Image, agent.Image)
	}
	if add := inst.SecurityContext.Capabilities.Add; len(add) != 0 {
		t.Errorf("install needs no capability, has %v", add)
	}
	add := agent.SecurityContext.Capabilities.Add
	slices.Sort(add)
	if !slices.Equal(add, []corev1.Capability{"NET_ADMIN", "NET_RAW"}) {
		t.Errorf("agent capabilities %v, want exactly NET_ADMIN and NET_RAW", add)
	}

	// The installer: villaged install writing the host's CNI directories,
	// mounted at the same paths so its manifest names real host files.
	if len(inst.Command) < 2 || inst.Command[0] != "villaged" || inst.Command[1] != "install" {
		t.Fatalf("init command %v, want villaged install ...", inst.Command)
	}
	args := flagMap(inst.Command[2:])
	for _, p := range []struct{ flag, path string }{{"--cni-bin-dir", "/opt/cni/bin"}, {"--cni-conf-dir", "/etc/cni/net.d"}, {"--state-dir", "/var/lib/village"}} {
		if got := args[p.flag]; got != p.path {
			t.Errorf("install %s = %q, want %s", p.flag, got, p.path)
		}
		host, ro := hostMount(t, spec, inst, p.path)
		if host != p.path || ro {
			t.Errorf("install: %s comes from host %s (readOnly %v), want the host's %s writable", p.path, host, ro, p.path)
		}
	}
	if args["--node-name"] != "$(NODE_NAME)" || !envFromField(inst, "NODE_NAME", "spec.nodeName") {
		t.Errorf("install must get the node name from the downward API: %v", inst.Command)
	}
	// The template it reads is the ConfigMap's key.
	tmplPath := args["--conf"]
	cm := o.configMaps[0]
	if !mountsConfigMapKey(spec, inst, tmplPath, cm.Name, cm.Data) {
		t.Errorf("install --conf %s is not a key of ConfigMap %s mounted in the init container", tmplPath, cm.Name)
	}

	// The agent: villaged run on the conflist install wrote.
	if len(agent.Command) < 2 || agent.Command[0] != "villaged" || agent.Command[1] != "run" {
		t.Fatalf("agent command %v, want villaged run ...", agent.Command)
	}
	// install stages the conflist; the agent publishes it in the runtime's
	// config directory once the node holds its pod subnet.
	stage := args["--stage-dir"]
	if stage == "" || strings.HasPrefix(stage, "/etc/cni/net.d") {
		t.Errorf("install --stage-dir %q, want a directory outside /etc/cni/net.d", stage)
	}
	agentArgs := flagMap(agent.Command[2:])
	confPath := agentArgs["--conf"]
	if confPath != filepath.Join(stage, install.DefaultConfName) {
		t.Errorf("agent --conf %q, want the file install stages: %s/%s", confPath, stage, install.DefaultConfName)
	}
	if host, _ := hostMount(t, spec, agent, filepath.Dir(confPath)); host != filepath.Join("/var/lib/village", "staged") {
		t.Errorf("agent reads the staged conflist from host %s", host)
	}
	if agentArgs["--publish-conf-dir"] != "/etc/cni/net.d" {
		t.Errorf("agent --publish-conf-dir %q, want /etc/cni/net.d", agentArgs["--publish-conf-dir"])
	}
	if host, ro := hostMount(t, spec, agent, "/etc/cni/net.d"); host != "/etc/cni/net.d" || ro {
		t.Errorf("agent publishes into /etc/cni/net.d: host %s readOnly %v", host, ro)
	}
	if host, ro := hostMount(t, spec, agent, "/run/village"); host != "/run/village" || ro {
		t.Errorf("agent publishes leased subnets in /run/village: host %s readOnly %v", host, ro)
	}
	// Liveness on /healthz, readiness ("this node can network pods") on
	// /readyz, both on the agent's loopback metrics address.
	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"livenessProbe", "/healthz", agent.LivenessProbe}, {"readinessProbe", "/readyz", agent.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("agent %s: want an httpGet probe of %s", p.name, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Host != "127.0.0.1" || g.Port.IntValue() != 9696 {
			t.Errorf("agent %s: %s:%s%s, want 127.0.0.1:9696%s", p.name, g.Host, g.Port.String(), g.Path, p.path)
		}
	}
	// The kubernetes registry: in-cluster credentials of the ServiceAccount.
	reg := renderVillage(t, cm).Overlay.Registry
	if reg == nil || reg.Type != netconf.RegistryKubernetes || reg.Kubeconfig != "" {
		t.Fatalf("the ConfigMap's conflist must use the kubernetes registry in-cluster, has %+v", reg)
	}
	if !envFromField(agent, "NODE_NAME", "spec.nodeName") || flagMap(agent.Command[2:])["--node-name"] != "$(NODE_NAME)" {
		t.Errorf("agent must get its Node's name from the downward API: %v", agent.Command)
	}
	sa := o.serviceAccounts[0]
	if spec.ServiceAccountName != sa.Name || sa.Namespace != ds.Namespace {
		t.Errorf("serviceAccountName %q, ServiceAccount %s/%s", spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("the agent reads Nodes in-cluster: automountServiceAccountToken must be true")
	}
	if sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken {
		t.Error("the ServiceAccount must not refuse its token")
	}
}

// ruleStrings is each rule of rs as "[groups] [resources] [names]
// [sorted verbs]"; a rule granting non-resource URLs is an error.
func ruleStrings(t *testing.T, rs []rbacv1.PolicyRule) []string {
	t.Helper()
	var out []string
	for _, r := range rs {
		if len(r.NonResourceURLs) != 0 {
			t.Errorf("rule %+v grants non-resource URLs", r)
		}
		out = append(out, fmt.Sprintf("%v %v %v %v", r.APIGroups, r.Resources, r.ResourceNames, slices.Sorted(slices.Values(r.Verbs))))
	}
	return out
}

// TestRBAC: the ClusterRoles and Roles grant exactly what villaged and the
// host-side village-ipam-kube use, bound to their ServiceAccounts. No
// Service nor EndpointSlice: only LAN Services need them, and
// examples/homelab/lan-services.yaml grants them (TestLANServicesExample).
func TestRBAC(t *testing.T) {
	o := load(t)
	rules := func(rs []rbacv1.PolicyRule) []string { return ruleStrings(t, rs) }
	want := map[string][]string{
		"ClusterRole village": {"[] [nodes] [] [get list watch]", "[] [nodes/status] [] [patch]", "[] [pods] [] [get list patch watch]",
			"[] [namespaces] [] [get list watch]", "[networking.k8s.io] [networkpolicies] [] [list watch]",
			"[] [events] [] [create patch]"},
		"ClusterRole village-ipam": {"[] [nodes] [] [get]"},
		"Role village":             {"[] [serviceaccounts/token] [village-ipam] [create]"},
		"Role village-ipam":        {"[coordination.k8s.io] [leases] [] [create delete get list update]"},
	}
	got := map[string][]string{}
	for _, r := range o.clusterRoles {
		got["ClusterRole "+r.Name] = rules(r.Rules)
	}
	for _, r := range o.roles {
		if r.Namespace != "kube-system" {
			t.Errorf("Role %s in namespace %q, want kube-system", r.Name, r.Namespace)
		}
		got["Role "+r.Name] = rules(r.Rules)
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("%s grants %q, want %q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("roles %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	ds := o.daemonSets[0]
	if ds.Spec.Template.Spec.ServiceAccountName != o.serviceAccounts[0].Name {
		t.Errorf("DaemonSet runs as %q, want %q", ds.Spec.Template.Spec.ServiceAccountName, o.serviceAccounts[0].Name)
	}
	for i, b := range o.bindings {
		sa := o.serviceAccounts[i]
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != o.clusterRoles[i].Name || b.RoleRef.APIGroup != "rbac.authorization.k8s.io" {
			t.Errorf("ClusterRoleBinding %s refers to %+v", b.Name, b.RoleRef)
		}
		if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
			t.Errorf("ClusterRoleBinding %s subjects %+v, want ServiceAccount %s/%s", b.Name, b.Subjects, sa.Namespace, sa.Name)
		}
	}
	for i, b := range o.roleBindings {
		sa := o.serviceAccounts[i]
		if b.RoleRef.Kind != "Role" || b.RoleRef.Name != o.roles[i].Name || b.Namespace != o.roles[i].Namespace {
			t.Errorf("RoleBinding %s refers to %+v", b.Name, b.RoleRef)
		}
		if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
			t.Errorf("RoleBinding %s subjects %+v, want ServiceAccount %s/%s", b.Name, b.Subjects, sa.Namespace, sa.Name)
		}
	}
	if ipam := o.serviceAccounts[1]; ipam.AutomountServiceAccountToken == nil || *ipam.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %s is no pod's: automountServiceAccountToken must be false", ipam.Name)
	}
}

// TestAdmissionPolicies: what RBAC cannot confine, admission.yaml's
// ValidatingAdmissionPolicies do, each bound with Deny and failing closed,
// each matching exactly the identity it confines: the agent (village) to its
// own Node, its node's Pods and Village's annotations, keyed on the
// node-name claim of its Pod-bound token; its TokenRequests to bound ones;
// its Events to those its recorder writes (village-events); the host-side
// pool store (village-ipam) to the store's own Leases.
// test/kube's LeastPrivilege proves they refuse what they must, on a real
// API server.
func TestAdmissionPolicies(t *testing.T) {
	o := load(t)
	user := func(sa *corev1.ServiceAccount) string {
		return "request.userInfo.username == 'system:serviceaccount:" + sa.Namespace + ":" + sa.Name + "'"
	}
	agent, ipam := o.serviceAccounts[0], o.serviceAccounts[1]
	want := []struct {
		name, user string
		groups     []string
		resources  []string
		ops        []admissionv1.OperationType
		mentions   []string
	}{
		{"village-agent", user(agent), []string{""}, []string{"nodes", "nodes/*", "pods", "pods/*", "services", "services/*"},
			[]admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect},
			[]string{"'authentication.kubernetes.io/node-name'", "oldObject.metadata.name == variables.node",
				"oldObject.spec.?nodeName.orValue('') == variables.node", "object.spec == oldObject.spec",
				"k.startsWith('" + kubenames.Prefix + "')"}},
		{"village-token", user(agent), []string{""}, []string{"serviceaccounts/token"},
			[]admissionv1.OperationType{admissionv1.Create},
			[]string{"boundObjectRef.kind.orValue('') == 'Node'", "boundObjectRef.name.orValue('') == variables.node",
				"all(a, a in variables.audiences)", "expirationSeconds.orValue(3600) <= 3600"}},
		{"village-ipam", user(ipam), []string{"coordination.k8s.io"}, []string{"leases"},
			[]admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete},
			[]string{"request.name.startsWith('" + kubestore.LeasePrefix + "')"}},
		{"village-events", user(agent), []string{"", "events.k8s.io"}, []string{"events"},
			[]admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete},
			[]string{"request.resource.group == ''", "object.?source.?host.orValue('') == variables.node",
				"object.?source.?component.orValue('') == '" + kubenames.Agent + "'", "object.?reportingComponent.orValue('') == '" + kubenames.Agent + "'",
				"object.?reportingInstance.orValue('') == variables.node", "object.involvedObject.?namespace.orValue('') == request.namespace",
				"'Pod': 'v1', 'Service': 'v1', 'Node': 'v1', 'NetworkPolicy': 'networking.k8s.io/v1'"}},
	}
	if len(o.policies) != len(want) || len(o.policyBindings) != len(want) {
		t.Fatalf("%d ValidatingAdmissionPolicies and %d bindings, want %d of each", len(o.policies), len(o.policyBindings), len(want))
	}
	for _, w := range want {
		i := slices.IndexFunc(o.policies, func(p *admissionv1.ValidatingAdmissionPolicy) bool { return p.Name == w.name })
		if i < 0 {
			t.Errorf("no ValidatingAdmissionPolicy %s", w.name)
			continue
		}
		p := o.policies[i].Spec
		if p.FailurePolicy == nil || *p.FailurePolicy != admissionv1.Fail || p.ParamKind != nil {
			t.Errorf("policy %s: failurePolicy %v, paramKind %v; want Fail and none", w.name, p.FailurePolicy, p.ParamKind)
		}
		if len(p.MatchConditions) != 1 || p.MatchConditions[0].Expression != w.user {
			t.Errorf("policy %s matches %+v, want only %s", w.name, p.MatchConditions, w.user)
		}
		mc := p.MatchConstraints
		if mc == nil || len(mc.ResourceRules) != 1 || mc.NamespaceSelector != nil || mc.ObjectSelector != nil {
			t.Fatalf("policy %s: matchConstraints %+v, want one rule and no selector", w.name, mc)
		}
		r := mc.ResourceRules[0]
		if !slices.Equal(r.APIGroups, w.groups) || !slices.Equal(r.Resources, w.resources) ||
			!slices.Equal(r.Operations, w.ops) || !slices.Equal(r.APIVersions, []string{"*"}) {
			t.Errorf("policy %s: rule %+v, want groups %q resources %v operations %v, every version", w.name, r, w.groups, w.resources, w.ops)
		}
		var all strings.Builder
		for _, v := range p.Validations {
			all.WriteString(v.Expression + "\n")
			if v.Reason == nil || *v.Reason != metav1.StatusReasonForbidden || (v.Message == "" && v.MessageExpression == "") {
				t.Errorf("policy %s: validation %q has reason %v and no message", w.name, v.Expression, v.Reason)
			}
		}
		for _, v := range p.Variables {
			all.WriteString(v.Expression + "\n")
		}
		for _, m := range w.mentions {
			if !strings.Contains(all.String(), m) {
				t.Errorf("policy %s does not check %s", w.name, m)
			}
		}
		j := slices.IndexFunc(o.policyBindings, func(b *admissionv1.ValidatingAdmissionPolicyBinding) bool { return b.Spec.PolicyName == w.name })
		if j < 0 {
			t.Errorf("policy %s is bound by nothing", w.name)
			continue
		}
		b := o.policyBindings[j]
		if b.Name != w.name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
			b.Spec.ParamRef != nil || b.Spec.MatchResources != nil {
			t.Errorf("binding %s: %+v, want Deny, no params and no narrower match", b.Name, b.Spec)
		}
	}
}

// renderVillage renders the ConfigMap's template the way the init container
// does and returns the parsed village entry, after checking the whole
// conflist with libcni.
func renderVillage(t *testing.T, cm *corev1.ConfigMap) *netconf.NetConf {
	t.Helper()
	if len(cm.Data) != 1 {
		t.Fatalf("ConfigMap %s: want one key (the template), got %d", cm.Name, len(cm.Data))
	}
	var tmpl string
	for _, v := range cm.Data {
		tmpl = v
	}
	vars := map[string]string{"NODE_NAME": "node1", "NODE_IP": "192.0.2.10", "DEFAULT_IFACE": "eth0"}
	out, err := install.Render([]byte(tmpl), func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatalf("ConfigMap template: %v", err)
	}
	list, err := libcni.ConfListFromBytes(out)
	if err != nil {
		t.Fatalf("ConfigMap conflist does not parse with libcni: %v\n%s", err, out)
	}
	for _, p := range list.Plugins {
		if p.Network.Type != "village" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal(p.Bytes, &m); err != nil {
			t.Fatal(err)
		}
		m["name"], m["cniVersion"] = list.Name, list.CNIVersion
		b, _ := json.Marshal(m)
		nc, err := netconf.Parse(b, "")
		if err != nil {
			t.Fatalf("ConfigMap village entry rejected by netconf.Parse: %v", err)
		}
		return nc
	}
	t.Fatal("the ConfigMap conflist has no village entry")
	return nil
}

func TestConfigMapConflist(t *testing.T) {
	o := load(t)
	nc := renderVillage(t, o.configMaps[0])
	if nc.Bridge != "village0" || nc.ClusterNet == nil || nc.ClusterNet.String() != "10.244.0.0/16" || !nc.IPMasq {
		t.Errorf("village entry: bridge %s clusterCIDR %v ipMasq %v", nc.Bridge, nc.ClusterNet, nc.IPMasq)
	}
	if nc.Overlay.Type != "auto" || nc.Overlay.Underlay != "eth0" {
		t.Errorf("backend %+v", nc.Overlay)
	}
	if nc.IPAMType != "village-ipam" {
		t.Errorf("ipam type %q", nc.IPAMType)
	}
	// The log goes where the init container makes sure a directory exists.
	ds := o.daemonSets[0]
	inst := container(t, ds.Spec.Template.Spec.InitContainers, "install")
	if host, _ := hostMount(t, &ds.Spec.Template.Spec, inst, filepath.Dir(nc.LogFile)); host != filepath.Dir(nc.LogFile) {
		t.Errorf("logFile %s: its directory is not created on the host by the init container", nc.LogFile)
	}
}

func flagMap(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(args); i++ {
		if strings.HasPrefix(args[i], "--") {
			m[args[i]] = args[i+1]
			i++
		}
	}
	return m
}

func tolerated(ts []corev1.Toleration, taint *corev1.Taint) bool {
	for i := range ts {
		if ts[i].ToleratesTaint(klog.Background(), taint, false) {
			return true
		}
	}
	return false
}

func subset(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func envFromField(c *corev1.Container, name, field string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == field {
			return true
		}
	}
	return false
}

func mountsConfigMapKey(spec *corev1.PodSpec, c *corev1.Container, path, cmName string, data map[string]string) bool {
	for _, m := range c.VolumeMounts {
		if filepath.Dir(path) != m.MountPath {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cmName {
				_, ok := data[filepath.Base(path)]
				return ok
			}
		}
	}
	return false
}
