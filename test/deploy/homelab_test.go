package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netconf"
)

// TestHomeLabExample: deploy/kubernetes/examples/homelab decodes strictly;
// its ConfigMap renders into a village entry with a LAN section of pods
// "annotated" and a kubernetes-store pool reached through the kubeconfig
// the agent writes; its Deployment asks for an address of that pool in a
// namespace allowed to ask, one replica, replaced by Recreate.
func TestHomeLabExample(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "deploy", "kubernetes", "examples", "homelab")
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var cm *corev1.ConfigMap
	var nsObj *corev1.Namespace
	var dep *appsv1.Deployment
	for _, name := range []string{"configmap-lan.yaml", "deployment.yaml"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			switch v := obj.(type) {
			case *corev1.ConfigMap:
				cm = v
			case *corev1.Namespace:
				nsObj = v
			case *appsv1.Deployment:
				dep = v
			}
		}
	}
	if cm == nil || nsObj == nil || dep == nil {
		t.Fatalf("want a ConfigMap, a Namespace and a Deployment; got %v %v %v", cm != nil, nsObj != nil, dep != nil)
	}
	if cm.Name != "village-config" || cm.Namespace != "kube-system" {
		t.Errorf("ConfigMap %s/%s must replace the shipped one", cm.Namespace, cm.Name)
	}
	nc := renderVillage(t, cm)
	lan := nc.LAN
	if lan == nil || lan.Pods != netconf.PodsAnnotated || !lan.HostShim {
		t.Fatalf("home-lab LAN section %+v, want pods annotated with the host shim", lan)
	}
	if nsObj.Labels[kubenames.LabelLAN] != kubenames.LabelLANAllowed || dep.Namespace != nsObj.Name {
		t.Errorf("Deployment in %q, namespace %s labels %v", dep.Namespace, nsObj.Name, nsObj.Labels)
	}
	ips, err := netconf.ParseLANAddrs(dep.Spec.Template.Annotations[kubenames.AnnotationLANIP])
	if err != nil {
		t.Fatal(err)
	}
	if err := lan.CheckAddrs(ips); err != nil {
		t.Errorf("the Deployment's address: %v", err)
	}
	if ips[0] != netip.MustParseAddr("192.168.50.220") {
		t.Errorf("address %v, the README says 192.168.50.220", ips)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("a fixed address needs one replica replaced by Recreate: %+v %+v", dep.Spec.Replicas, dep.Spec.Strategy)
	}
}
