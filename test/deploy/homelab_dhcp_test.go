package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/landhcp"
	"github.com/village-cni/village/pkg/netconf"
)

// homelabDir is deploy/kubernetes/examples/homelab.
func homelabDir(t *testing.T) string {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "kubernetes", "examples", "homelab")
}

// decodeFile decodes every document of a manifest strictly.
func decodeFile(t *testing.T, path string) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(path), err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(path), err)
		}
		objs = append(objs, obj)
	}
}

// TestHomeLabDHCPExample: the home-lab DHCP variant. Its ConfigMap replaces
// the shipped one and renders into a LAN section of pods "annotated" whose
// addresses come from the LAN's DHCP server, with the router's pool routed
// by the host shim; its StatefulSet asks for the LAN (no fixed address) in
// an allowed namespace, one replica so its pod keeps its name and MAC.
func TestHomeLabDHCPExample(t *testing.T) {
	dir := homelabDir(t)
	var cm *corev1.ConfigMap
	for _, o := range decodeFile(t, filepath.Join(dir, "configmap-lan-dhcp.yaml")) {
		if v, ok := o.(*corev1.ConfigMap); ok {
			cm = v
		}
	}
	if cm == nil || cm.Name != "village-config" || cm.Namespace != "kube-system" {
		t.Fatalf("configmap-lan-dhcp.yaml must hold the ConfigMap kube-system/village-config, has %v", cm)
	}
	lan := renderVillage(t, cm).LAN
	if lan == nil || lan.IPAMType != netconf.LANDHCP || lan.Pods != netconf.PodsAnnotated || !lan.HostShim || len(lan.Ranges) == 0 {
		t.Fatalf("DHCP LAN section %+v, want ipam dhcp, pods annotated, the host shim with the router's pool", lan)
	}
	var nsObj *corev1.Namespace
	var sts *appsv1.StatefulSet
	for _, o := range decodeFile(t, filepath.Join(dir, "statefulset-dhcp.yaml")) {
		switch v := o.(type) {
		case *corev1.Namespace:
			nsObj = v
		case *appsv1.StatefulSet:
			sts = v
		}
	}
	if nsObj == nil || sts == nil {
		t.Fatalf("statefulset-dhcp.yaml: want a Namespace and a StatefulSet")
	}
	if nsObj.Labels[kubenames.LabelLAN] != kubenames.LabelLANAllowed || sts.Namespace != nsObj.Name {
		t.Errorf("StatefulSet in %q, namespace %s labels %v", sts.Namespace, nsObj.Name, nsObj.Labels)
	}
	ann := sts.Spec.Template.Annotations
	if ann[kubenames.AnnotationLAN] != "true" || ann[kubenames.AnnotationLANIP] != "" {
		t.Errorf("StatefulSet annotations %v: want %s \"true\" and no fixed address (the router reserves it)", ann, kubenames.AnnotationLAN)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1", sts.Spec.Replicas)
	}
}

// TestDHCPDaemonSetPatch: daemonset-dhcp.yaml, applied to the shipped
// DaemonSet as `kubectl patch --patch-file` does (a strategic merge), adds
// exactly what the DHCP client needs to the agent and nothing else: the
// capability SYS_ADMIN (setns) beside NET_ADMIN and NET_RAW, the host's
// /run/netns read-only with HostToContainer propagation at /var/run/netns,
// and the lease directory writable; still unprivileged, without privilege
// escalation or hostPID, the installer untouched.
func TestDHCPDaemonSetPatch(t *testing.T) {
	o := load(t)
	shipped := o.daemonSets[0]
	base, err := json.Marshal(shipped)
	if err != nil {
		t.Fatal(err)
	}
	// The patch decodes strictly as a DaemonSet (a misspelt field fails).
	patchYAML, err := os.ReadFile(filepath.Join(homelabDir(t), "daemonset-dhcp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var strict appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(patchYAML, &strict); err != nil {
		t.Fatalf("daemonset-dhcp.yaml is not a DaemonSet patch: %v", err)
	}
	patch, err := yaml.YAMLToJSON(patchYAML)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(base, patch, appsv1.DaemonSet{})
	if err != nil {
		t.Fatalf("strategic merge of daemonset-dhcp.yaml: %v", err)
	}
	ds := &appsv1.DaemonSet{}
	if err := json.Unmarshal(merged, ds); err != nil {
		t.Fatal(err)
	}
	spec := &ds.Spec.Template.Spec
	if spec.HostPID || spec.HostIPC {
		t.Error("the DHCP grant must not share the host's PID or IPC namespace")
	}
	agentC := container(t, spec.Containers, "agent")
	sc := agentC.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Fatalf("patched agent securityContext %+v: want unprivileged, no escalation, read-only root, drop ALL", sc)
	}
	add := slices.Clone(sc.Capabilities.Add)
	slices.Sort(add)
	if !slices.Equal(add, []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}) {
		t.Errorf("patched agent capabilities %v, want exactly NET_ADMIN, NET_RAW and SYS_ADMIN", add)
	}
	// Every mount of the shipped agent is still there, unchanged.
	shippedAgent := container(t, shipped.Spec.Template.Spec.Containers, "agent")
	for _, m := range shippedAgent.VolumeMounts {
		if !slices.ContainsFunc(agentC.VolumeMounts, func(x corev1.VolumeMount) bool { return reflect.DeepEqual(x, m) }) {
			t.Errorf("the patch changed or dropped the agent's mount %+v", m)
		}
	}
	if n := len(agentC.VolumeMounts) - len(shippedAgent.VolumeMounts); n != 2 {
		t.Errorf("the patch adds %d mounts to the agent, want 2 (netns, leases)", n)
	}
	mount := func(path string) *corev1.VolumeMount {
		for i := range agentC.VolumeMounts {
			if agentC.VolumeMounts[i].MountPath == path {
				return &agentC.VolumeMounts[i]
			}
		}
		t.Fatalf("patched agent: nothing mounted at %s", path)
		return nil
	}
	// At the path containerd and CRI-O pass as CNI_NETNS, from the
	// directory /var/run/netns links to on the host.
	nm := mount("/var/run/netns")
	if host, ro := hostMount(t, spec, agentC, nm.MountPath); host != "/run/netns" || !ro ||
		nm.MountPropagation == nil || *nm.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("netns mount %+v from host %s: want the host's /run/netns, read-only, HostToContainer", nm, host)
	}
	if host, ro := hostMount(t, spec, agentC, landhcp.DefaultDir); host != landhcp.DefaultDir || ro {
		t.Errorf("lease directory from host %s readOnly %v, want the host's %s writable", host, ro, landhcp.DefaultDir)
	}
	// The installer is what it was.
	inst, shippedInst := container(t, spec.InitContainers, "install"), container(t, shipped.Spec.Template.Spec.InitContainers, "install")
	a, _ := json.Marshal(inst)
	b, _ := json.Marshal(shippedInst)
	if !bytes.Equal(a, b) {
		t.Errorf("the patch changed the install init container:\n%s\nwas\n%s", a, b)
	}
}
