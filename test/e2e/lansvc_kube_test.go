package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc"
	"github.com/village-cni/village/pkg/lansvc/elect"
)

// lanServicesBlock is a LAN (the nodes' lan0) whose pool is in the API
// server's Leases, with "macvlan.services" on and the gossip key in
// keyFile.
func lanServicesBlock(storeKubeconfig, keyFile string) string {
	return fmt.Sprintf(`"macvlan":{"master":"lan0",
		"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.79.0/24","rangeStart":"192.168.79.100","rangeEnd":"192.168.79.150"}]],
			"store":{"type":"kubernetes","kubeconfig":%q,"namespace":"default"}},
		"services":{"gossipKeyFile":%q,"ranges":[[{"subnet":"192.168.79.0/24","rangeStart":"192.168.79.240","rangeEnd":"192.168.79.250"}]]}},`, storeKubeconfig, keyFile)
}

// TestLANServicesFailover: three node namespaces run the real `villaged
// run` with "macvlan.services" against a real kube-apiserver (the agents
// as the DaemonSet's account, bound by deploy/kubernetes/rbac.yaml and the
// home lab's lan-services.yaml, confined by their admission policies). A
// LoadBalancer Service in an allowed namespace gets the first Service
// address in its status (ipMode VIP); a LAN client's ARP request for it
// is answered by exactly one MAC, the lan0 of the node the Service's
// lan-announcer annotation names, and `villaged status` there lists it.
// The announcer's LAN link goes down: another node answers (the time is
// logged), again exactly one MAC; it comes back: it answers again, alone.
// Deleting the Service silences the address, and another Service can ask
// for it. The agents gossip under a key (macvlan.services.gossipKeyFile);
// an agent that cannot read it keeps the feature off rather than gossip
// in the clear, and says so in `villaged status`.
func TestLANServicesFailover(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "gossip-key")
	must(t, os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString([]byte("home-lab-gossip-key-of-32-bytes!"))+"\n"), 0o600), "writing the gossip key")
	lab := newKubeLabWith(t, "vxlan", func(conf string, kube *kubetest.Server) string {
		return strings.Replace(conf, `"ipMasq":true,`, `"ipMasq":true,`+lanServicesBlock(kube.AdminKubeconfig, keyFile), 1)
	})
	kube := lab.kube
	// The grant and guard LAN Services need, with this LAN's range.
	applyManifest(t, kube, filepath.Join("deploy", "kubernetes", "examples", "homelab", "lan-services.yaml"), func(doc []byte) []byte {
		return bytes.ReplaceAll(doc, []byte("[['192.168.50.240', '192.168.50.250']]"), []byte("[['192.168.79.240', '192.168.79.250']]"))
	})
	client := testenv.NewNS(t)
	lab.lan.Attach(t, client, "eth0", "192.168.79.9/24")
	ctx := context.Background()
	cs := kube.Client
	macs := map[string]string{} // node name -> its lan0 MAC
	for i, n := range lab.nodes {
		lab.createNode(n, fmt.Sprintf("10.70.%d.0/24", i+1))
		node := lab.node(n.name)
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		_, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		must(t, err, "making Node %s Ready", n.name)
		must(t, testenv.InNS(n.NS, func() error {
			l, err := netlink.LinkByName("lan0")
			if err == nil {
				macs[n.name] = l.Attrs().HardwareAddr.String()
			}
			return err
		}), "reading %s's lan0", n.name)
	}
	lab.startAll()

	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "home",
		Labels: map[string]string{kubenames.LabelLAN: kubenames.LabelLANAllowed}}}, metav1.CreateOptions{})
	must(t, err, "creating namespace home")
	_, err = cs.CoreV1().Services("home").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	must(t, err, "creating Service home/web")
	const vip = "192.168.79.240"
	waitFor(t, time.Minute, "home/web's status", func() (bool, string) {
		s, err := cs.CoreV1().Services("home").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		in := s.Status.LoadBalancer.Ingress
		return len(in) == 1 && in[0].IP == vip && in[0].IPMode != nil && *in[0].IPMode == corev1.LoadBalancerIPModeVIP, fmt.Sprintf("ingress %+v", in)
	})
	ip := netip.MustParseAddr(vip)
	answers := func(want string) func() (bool, string) {
		return func() (bool, string) {
			got, err := testenv.ARPAnswers(client, "eth0", ip, 300*time.Millisecond)
			if err != nil {
				return false, err.Error()
			}
			return slices.Equal(got, []string{want}), fmt.Sprintf("answered by %v, want only %s", got, want)
		}
	}
	// One MAC answers, the annotation names its node, and `villaged
	// status` there lists the address and every agent live, all at one
	// moment, and that node is the election's owner with every node
	// alive: while the agents' gossip forms at start-up another node may
	// answer for a moment, and the failback below needs the owner.
	var names []string
	for _, n := range lab.nodes {
		names = append(names, n.name)
	}
	slices.Sort(names)
	owner := elect.Owner(ip, names, func(string) bool { return true })
	allLive := fmt.Sprintf("live agents %v", names)
	var announcer string
	var holder *agentNode
	waitFor(t, time.Minute, "the elected "+owner+" answers ARP for "+vip+" alone, is home/web's lan-announcer and lists it and every agent live in villaged status", func() (bool, string) {
		s, err := cs.CoreV1().Services("home").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		announcer = s.Annotations[kubenames.AnnotationLANAnnouncer]
		holder = nil
		for _, n := range lab.nodes {
			if n.name == announcer {
				holder = n
			}
		}
		if holder == nil || announcer != owner {
			return false, fmt.Sprintf("announcer annotation %q, want %s", announcer, owner)
		}
		if ok, state := answers(macs[announcer])(); !ok {
			return false, state
		}
		out, _ := holder.villaged(t, "status", "--conf", lab.conf, "--node-name", holder.name, "--run-dir", holder.runDir).CombinedOutput()
		return strings.Contains(string(out), "answering for 1 of 1") && strings.Contains(string(out), "  "+vip) && strings.Contains(string(out), allLive), "villaged status on " + announcer + ":\n" + string(out)
	})
	for _, n := range lab.nodes {
		if log := n.log.String(); !strings.Contains(log, "encrypted and authenticated") || strings.Contains(log, lansvc.GossipInTheClear) {
			t.Fatalf("villaged on %s, with a gossip key: no \"encrypted and authenticated\", or the in-the-clear warning, in its log:\n%s", n.name, log)
		}
	}

	// The announcer drops off the LAN.
	testenv.MustIP(t, holder.NS, "link", "set", "lan0", "down")
	began := time.Now()
	var next string
	waitFor(t, 30*time.Second, "another node answers for "+vip, func() (bool, string) {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 100*time.Millisecond)
		if err != nil || len(got) != 1 || got[0] == macs[announcer] {
			return false, fmt.Sprintf("%v %v", got, err)
		}
		for n, m := range macs {
			if m == got[0] {
				next = n
			}
		}
		return next != "", fmt.Sprintf("%v", got)
	})
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("failover from %s to %s: answered within %s of the link going down (load %s)", announcer, next, time.Since(began).Round(time.Millisecond), strings.TrimSpace(string(load)))
	waitFor(t, 30*time.Second, "only "+next+" answers", answers(macs[next]))
	waitFor(t, 30*time.Second, "home/web's announcer annotation names "+next, func() (bool, string) {
		s, err := cs.CoreV1().Services("home").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return s.Annotations[kubenames.AnnotationLANAnnouncer] == next, fmt.Sprint(s.Annotations)
	})

	// The old announcer comes back: it has the highest score, so it takes
	// the address back once it has settled, and never beside the other.
	testenv.MustIP(t, holder.NS, "link", "set", "lan0", "up")
	waitFor(t, 30*time.Second, announcer+" answers again, alone", answers(macs[announcer]))
	for range 10 {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 200*time.Millisecond)
		must(t, err, "asking for %s", vip)
		if len(got) > 1 {
			t.Fatalf("two MACs answer for %s after %s came back: %v", vip, announcer, got)
		}
	}

	// The API server freezes (SIGSTOP: its sockets stay open and nothing
	// answers, as a hung control plane). Once every agent has failed a read
	// of the LAN pool through it, the announcer drops off the LAN again:
	// another node still takes over, from the last known wants, and the old
	// one answers again alone when it is back; all with the API frozen.
	thaw, err := kube.FreezeAPIServer()
	must(t, err, "freezing the API server")
	t.Cleanup(thaw)
	marks := map[string]int{}
	for _, n := range lab.nodes {
		marks[n.name] = len(n.log.String())
	}
	waitFor(t, 2*time.Minute, "every agent fails a read of the LAN pool through the frozen API server", func() (bool, string) {
		for _, n := range lab.nodes {
			if !strings.Contains(n.log.String()[marks[n.name]:], "listing the LAN pool") {
				return false, n.name + " has not yet:\n" + n.log.String()[marks[n.name]:]
			}
		}
		return true, ""
	})
	testenv.MustIP(t, holder.NS, "link", "set", "lan0", "down")
	began = time.Now()
	waitFor(t, 30*time.Second, "another node answers for "+vip+" with the API server frozen", func() (bool, string) {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 100*time.Millisecond)
		return err == nil && len(got) == 1 && got[0] != macs[announcer], fmt.Sprintf("%v %v", got, err)
	})
	load, _ = os.ReadFile("/proc/loadavg")
	t.Logf("failover with the API server frozen: answered within %s of the link going down (load %s)", time.Since(began).Round(time.Millisecond), strings.TrimSpace(string(load)))
	testenv.MustIP(t, holder.NS, "link", "set", "lan0", "up")
	waitFor(t, 30*time.Second, announcer+" answers again, alone, with the API server frozen", answers(macs[announcer]))
	// Its agent restarts, the API server still frozen: another node
	// answers meanwhile, and the new agent, from the state the old one
	// kept in the run directory (it cannot list a thing), rejoins the
	// others and answers again, alone.
	must(t, holder.stop(t, syscall.SIGTERM), "stopping villaged on %s", announcer)
	waitFor(t, 30*time.Second, "another node answers while "+announcer+"'s agent is down", func() (bool, string) {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 100*time.Millisecond)
		return err == nil && len(got) == 1 && got[0] != macs[announcer], fmt.Sprintf("%v %v", got, err)
	})
	mark := len(holder.log.String())
	lab.start(holder)
	waitFor(t, time.Minute, announcer+"'s restarted agent answers again, alone, with the API server frozen", answers(macs[announcer]))
	if log := holder.log.String()[mark:]; !strings.Contains(log, "1 addresses and 2 peers kept from") {
		t.Fatalf("the restarted agent on %s did not start from its kept state:\n%s", announcer, log)
	}
	thaw()

	// Deleting the Service: nobody answers, and the address can be taken
	// again (asked for exactly).
	must(t, cs.CoreV1().Services("home").Delete(ctx, "web", metav1.DeleteOptions{}), "deleting home/web")
	waitFor(t, 30*time.Second, "no answer for "+vip, func() (bool, string) {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 200*time.Millisecond)
		return err == nil && len(got) == 0, fmt.Sprintf("%v %v", got, err)
	})
	_, err = cs.CoreV1().Services("home").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "again",
		Annotations: map[string]string{kubenames.AnnotationLANIP: vip}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 8080}}}}, metav1.CreateOptions{})
	must(t, err, "creating Service home/again")
	waitFor(t, time.Minute, "home/again gets "+vip, func() (bool, string) {
		s, err := cs.CoreV1().Services("home").Get(ctx, "again", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		in := s.Status.LoadBalancer.Ingress
		return len(in) == 1 && in[0].IP == vip, fmt.Sprintf("ingress %+v", in)
	})
	// The key file goes away (a Secret deleted) and an agent restarts: it
	// keeps the feature off, says why, and does not answer; the others,
	// which read the key at their start, still do.
	must(t, os.Remove(keyFile), "removing the gossip key")
	var restarted *agentNode
	for _, n := range lab.nodes {
		if n.name != announcer {
			restarted = n
		}
	}
	must(t, restarted.stop(t, syscall.SIGTERM), "stopping villaged on %s", restarted.name)
	lab.start(restarted)
	waitFor(t, 30*time.Second, "villaged status on "+restarted.name+" says LAN Services are off for want of the key", func() (bool, string) {
		out, _ := restarted.villaged(t, "status", "--conf", lab.conf, "--node-name", restarted.name, "--run-dir", restarted.runDir).CombinedOutput()
		return strings.Contains(string(out), "OFF: members: gossip key: ") && strings.Contains(string(out), keyFile), string(out)
	})
	waitFor(t, 30*time.Second, "a node other than "+restarted.name+" answers for "+vip, func() (bool, string) {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 200*time.Millisecond)
		return err == nil && len(got) == 1 && got[0] != macs[restarted.name], fmt.Sprintf("%v %v", got, err)
	})
	for range 5 {
		got, err := testenv.ARPAnswers(client, "eth0", ip, 200*time.Millisecond)
		must(t, err, "asking for %s", vip)
		if len(got) != 1 || got[0] == macs[restarted.name] {
			t.Fatalf("%s answered by %v after %s restarted without its key, want one MAC, not %s", vip, got, restarted.name, macs[restarted.name])
		}
	}
}
