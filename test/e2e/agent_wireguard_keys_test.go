package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
	"github.com/village-cni/village/pkg/wireguard"
)

// newWireGuardLab is the kubernetes lab under backend wireguard with its
// three agents started (see wireGuardNodes).
func newWireGuardLab(t *testing.T) (*kubeLab, []string) {
	keyDir := t.TempDir()
	lab := newKubeLabWith(t, "wireguard", func(conf string, _ *kubetest.Server) string {
		return wireGuardConf(conf, keyDir)
	})
	for i, n := range lab.nodes {
		lab.createNode(n, fmt.Sprintf("10.70.%d.0/24", i+1))
	}
	wireGuardNodes(lab.agentLab, keyDir)
	return lab, lab.startAll()
}

// newWireGuardEtcdLab is newWireGuardLab with the etcd registry, and keys
// rotated when an hour old ("keyRotation").
func newWireGuardEtcdLab(t *testing.T) (*agentLab, []string) {
	keyDir := t.TempDir()
	lab := newEtcdLabOf(t, 3, func(dataDir string) string {
		return strings.Replace(wireGuardConf(agentConflist("wireguard", dataDir), keyDir), `"wireguard":{`, `"wireguard":{"keyRotation":"1h",`, 1)
	})
	wireGuardNodes(lab, keyDir)
	return lab, lab.startAll()
}

// wireGuardConf is a lab conflist under backend wireguard, the key file in
// keyDir.
func wireGuardConf(conf, keyDir string) string {
	return strings.Replace(conf, `"vni":9,`, fmt.Sprintf(`"wireguard":{"keyFile":%q},`, filepath.Join(keyDir, "agt.key")), 1)
}

// wireGuardNodes gives the lab's agents their private mounts. Every node
// namespace shares this machine's file system, where a real node has its
// own: each agent runs with its own directory mounted over
// /var/run/wireguard (its userspace device's UAPI socket, named the same
// on every node: <node dir>/wgrun, where wgDevice reads it) and over the
// conflist's key directory (so that each node has its own key, <node
// dir>/wg/agt.key, kept across restarts), both mounts in the mount
// namespace `ip netns exec` gives it.
func wireGuardNodes(lab *agentLab, keyDir string) {
	for _, n := range lab.nodes {
		wireGuardNode(lab.t, n, keyDir)
	}
}

// In a capture of a wireguard lab node's underlay (testenv.OnlyCarried):
// wgLabTunnel is WireGuard's UDP between the nodes; wgLabAllowed the
// agents' API connections (the registry) and the underlay's own chatter.
var (
	wgLabTunnel  = regexp.MustCompile(`^\S+ IP 192\.168\.79\.1\d\.51820 > 192\.168\.79\.1\d\.51820: UDP, length \d+$`)
	wgLabAllowed = regexp.MustCompile(`^\S+ IP (192\.168\.79\.1\d\.\d+ > 192\.168\.79\.5\.\d+|192\.168\.79\.5\.\d+ > 192\.168\.79\.1\d\.\d+): Flags |` +
		testenv.UnderlayChatter.String())
)

// wgKey is the public key of n's key file.
func wgKey(t *testing.T, n *agentNode) string {
	t.Helper()
	_, pub, err := wireguard.LoadKey(filepath.Join(n.Dir, "wg", "agt.key"))
	must(t, err, "the key file of %s", n.name)
	return pub.String()
}

// wgDevice reads n's WireGuard device through wgctrl.
func wgDevice(t *testing.T, n *agentNode) *wgtypes.Device {
	t.Helper()
	return testenv.WireGuardDevice(t, n.NS.Path(), filepath.Join(n.Dir, "wgrun"), overlay.WireGuardDeviceName(overlay.DefaultWireGuardPort))
}

// handshakeSince says when n's device last completed a handshake with
// the peer of key, from t0.
func handshakeSince(t *testing.T, n *agentNode, key string, t0 time.Time) string {
	for _, p := range wgDevice(t, n).Peers {
		if p.PublicKey.String() == key {
			if p.LastHandshakeTime.IsZero() {
				return "never"
			}
			return fmt.Sprintf("%v after it", p.LastHandshakeTime.Sub(t0).Round(time.Millisecond))
		}
	}
	return "none: no such peer"
}

// peersHave tells whether every node but self has exactly one peer per
// other node, key among them (and none with a key of gone): no stale peer.
func peersHave(t *testing.T, lab *agentLab, self *agentNode, key string, gone ...string) (bool, string) {
	var why []string
	for _, n := range lab.nodes {
		if n == self {
			continue
		}
		d := wgDevice(t, n)
		var keys []string
		has := false
		for _, p := range d.Peers {
			keys = append(keys, p.PublicKey.String())
			has = has || p.PublicKey.String() == key
			for _, g := range gone {
				if p.PublicKey.String() == g {
					why = append(why, fmt.Sprintf("%s still has the old peer %s", n.name, g))
				}
			}
		}
		if !has || len(d.Peers) != len(lab.nodes)-1 {
			why = append(why, fmt.Sprintf("%s's peers %v (want %d, %s among them)", n.name, keys, len(lab.nodes)-1, key))
		}
	}
	return len(why) == 0, strings.Join(why, "; ")
}

// pingPattern fills pingEvery's payloads ("WireGuardKey"), which a
// capture of the underlay must never hold.
const pingPattern, pingSecret = "5769726547756172644b6579", "WireGuardKey"

// pingEvery pings dst from n every 100 ms, count times, with pingPattern,
// and sends ping's outcome when it is done.
func pingEvery(n ns.NetNS, dst string, count int) <-chan pingResult {
	done := make(chan pingResult, 1)
	go func() {
		out, _ := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "ping", "-n", "-q", "-i", "0.1", "-W", "2", "-p", pingPattern, "-c", strconv.Itoa(count), dst).CombinedOutput()
		r := pingResult{sent: -1, got: -1, out: string(out)}
		if m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) (packets )?received`).FindStringSubmatch(r.out); m != nil {
			r.sent, _ = strconv.Atoi(m[1])
			r.got, _ = strconv.Atoi(m[2])
		}
		if m := regexp.MustCompile(`= [\d.]+/[\d.]+/([\d.]+)/`).FindStringSubmatch(r.out); m != nil {
			r.maxRTT = m[1] + " ms"
		}
		done <- r
	}()
	return done
}

// pingResult is what ping said: packets sent and answered, the longest
// round trip.
type pingResult struct {
	sent, got int
	maxRTT    string
	out       string
}

// The keys of backend wireguard (three villaged nodes, userspace devices
// here), with either registry: `villaged rotate-key` on node1 under a
// 100 ms ping loop both ways loses no packet, while a capture of node1's
// underlay holds nothing between the nodes but WireGuard's UDP; the peers'
// devices (read through wgctrl) then know node1 by the new key only, which
// is what node1 publishes (Node annotation, etcd record) and holds in its
// key file, and stays so across a restart. Then node3 is reinstalled (its
// key file deleted, its agent restarted): it comes back with a new key,
// which replaces its old peer entry on every other node, leaving no stale
// peer, and its pods are reachable again.
func TestAgentWireGuardKeys(t *testing.T) {
	t.Run("kubernetes", func(t *testing.T) {
		lab, subnets := newWireGuardLab(t)
		wireGuardKeys(t, lab.agentLab, subnets, func(name string) string {
			return lab.node(name).Annotations[kubenames.AnnotationWireGuardKey]
		})
	})
	t.Run("etcd", func(t *testing.T) {
		lab, subnets := newWireGuardEtcdLab(t)
		cli := lab.etcd.ClientIn(t, lab.host)
		published := func(name string) string {
			resp, err := cli.Get(context.Background(), "/village/nodes/agt/"+name)
			if err != nil || len(resp.Kvs) != 1 {
				return fmt.Sprintf("no record (%v)", err)
			}
			var rec registry.Node
			if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
				return err.Error()
			}
			return rec.WireGuardKey
		}
		wireGuardKeys(t, lab, subnets, published)

		// keyRotation: node2's key made two hours ago (its key file's
		// time) is rotated by its agent on its own, and the peers take
		// the new key.
		n2 := lab.nodes[1]
		before := wgKey(t, n2)
		must(t, n2.stop(t, syscall.SIGTERM), "stopping node2's agent")
		old := time.Now().Add(-2 * time.Hour)
		must(t, os.Chtimes(filepath.Join(n2.Dir, "wg", "agt.key"), old, old), "making node2's key two hours old")
		lab.start(n2)
		var rotated string
		waitFor(t, 60*time.Second, "node2's agent rotates its two-hour-old key (keyRotation 1h) and publishes the new one", func() (bool, string) {
			rotated = wgKey(t, n2)
			return rotated != before && published(n2.name) == rotated, published(n2.name)
		})
		waitFor(t, 30*time.Second, "the peers know node2 by its rotated key only", func() (bool, string) {
			return peersHave(t, lab, n2, rotated, before)
		})
		fi, err := os.Stat(filepath.Join(n2.Dir, "wg", "agt.key"))
		must(t, err, "node2's key file")
		if time.Since(fi.ModTime()) > time.Hour {
			t.Fatalf("node2's rotated key file is dated %v: the next start would rotate again", fi.ModTime())
		}
	})
}

// wireGuardKeys is TestAgentWireGuardKeys on lab, whose nodes publish
// their keys where published reads them.
func wireGuardKeys(t *testing.T, lab *agentLab, subnets []string, published func(node string) string) {
	n1, n3 := lab.nodes[0], lab.nodes[2]
	old := map[string]string{}
	for _, n := range lab.nodes {
		old[n.name] = wgKey(t, n)
		waitFor(t, 30*time.Second, n.name+" publishes its WireGuard key", func() (bool, string) {
			a := published(n.name)
			return a == old[n.name], a
		})
	}
	pods := lab.podsPing(subnets)
	waitFor(t, 30*time.Second, "every node has the others as its only peers", func() (bool, string) {
		return peersHave(t, lab, n1, old[n1.name])
	})

	// Rotation under a 100 ms ping loop, both ways through node1.
	capt := testenv.StartPcap(t, n1.NS, "lan0")
	const count = 150 // 15 s: the rotation and the peers' switch fall inside
	to1 := pingEvery(pods[1].NS, podIPv4(t, pods[0]), count)
	from1 := pingEvery(pods[0].NS, podIPv4(t, pods[2]), count)
	out, err := n1.villaged(t, "rotate-key", "--conf", lab.conf, "--node-name", n1.name, "--run-dir", n1.runDir).CombinedOutput()
	must(t, err, "villaged rotate-key: %s", out)
	t.Logf("villaged rotate-key: %s", strings.TrimSpace(string(out)))
	fresh := wgKey(t, n1)
	if fresh == old[n1.name] || !strings.Contains(string(out), fresh) {
		t.Fatalf("after rotate-key the key file holds %s (was %s); the command said %q", fresh, old[n1.name], out)
	}
	// When each peer took the new key, and when node1 last completed a
	// handshake with node3 (the one way whose packets only node1 starts),
	// both from rotate-key's return: the figures that tell a lost ping's
	// cause.
	rotated, took := time.Now(), map[string]time.Duration{}
	waitFor(t, 30*time.Second, "the peers know node1 by its new key only", func() (bool, string) {
		for _, n := range lab.nodes[1:] {
			if _, ok := took[n.name]; !ok && slices.ContainsFunc(wgDevice(t, n).Peers, func(p wgtypes.Peer) bool { return p.PublicKey.String() == fresh }) {
				took[n.name] = time.Since(rotated).Round(time.Millisecond)
			}
		}
		return peersHave(t, lab, n1, fresh, old[n1.name])
	})
	select {
	case <-to1:
		t.Fatalf("the ping loop ended before the peers took node1's new key: the rotation fell outside it")
	default:
	}
	when := fmt.Sprintf("after rotate-key: node2 took the new key in %v, node3 in %v; node1's last handshake with node3 %s",
		took[lab.nodes[1].name], took[n3.name], handshakeSince(t, n1, wgKey(t, n3), rotated))
	for what, ch := range map[string]<-chan pingResult{"pod on node2 -> pod on node1": to1, "pod on node1 -> pod on node3": from1} {
		r := <-ch
		if r.sent != count || r.got != count {
			t.Errorf("%s every 100 ms through the rotation: %d sent, %d answered; want %d of %d (%s):\n%s", what, r.sent, r.got, count, count, when, r.out)
		} else {
			t.Logf("%s every 100 ms through the rotation: %d of %d answered, longest round trip %s (%s)", what, r.got, r.sent, r.maxRTT, when)
		}
	}
	raw, lines := capt.Stop()
	n := testenv.OnlyCarried(t, raw, lines, wgLabTunnel, wgLabAllowed, pingSecret)
	t.Logf("node1's underlay through the rotation: %d WireGuard packets between nodes, no plaintext", n)
	waitFor(t, 30*time.Second, "node1 publishes the new key", func() (bool, string) {
		a := published(n1.name)
		return a == fresh, a
	})

	// The new key survives a restart.
	must(t, n1.stop(t, syscall.SIGTERM), "stopping node1's agent")
	lab.start(n1)
	waitFor(t, 30*time.Second, "pod on node2 -> pod on node1 after the restart", func() (bool, string) {
		err := testenv.Ping(pods[1].NS, podIPv4(t, pods[0]), 1)
		return err == nil, fmt.Sprint(err)
	})
	if k := wgKey(t, n1); k != fresh {
		t.Fatalf("node1's key changed across the restart: %s -> %s", fresh, k)
	}
	waitFor(t, 30*time.Second, "node1 publishes the new key after the restart", func() (bool, string) {
		a := published(n1.name)
		return a == fresh, a
	})
	if ok, why := peersHave(t, lab, n1, fresh, old[n1.name]); !ok {
		t.Fatalf("after node1's restart: %s", why)
	}

	// node3 reinstalled: a new key, and no stale peer anywhere.
	must(t, n3.stop(t, syscall.SIGTERM), "stopping node3's agent")
	must(t, os.Remove(filepath.Join(n3.Dir, "wg", "agt.key")), "deleting node3's key")
	lab.start(n3)
	waitFor(t, 30*time.Second, "node3 makes a new key", func() (bool, string) {
		_, err := os.Stat(filepath.Join(n3.Dir, "wg", "agt.key"))
		return err == nil, fmt.Sprint(err)
	})
	reinstalled := wgKey(t, n3)
	if reinstalled == old[n3.name] {
		t.Fatalf("node3 reinstalled kept its key %s", reinstalled)
	}
	waitFor(t, 30*time.Second, "node3's new key replaces its old peer on every other node", func() (bool, string) {
		return peersHave(t, lab, n3, reinstalled, old[n3.name])
	})
	waitFor(t, 30*time.Second, "pod on node1 -> pod on node3 after the reinstall", func() (bool, string) {
		err := testenv.Ping(pods[0].NS, podIPv4(t, pods[2]), 1)
		return err == nil, fmt.Sprint(err)
	})
	must(t, testenv.Ping(pods[2].NS, podIPv4(t, pods[1]), 2), "pod on node3 -> pod on node2 after the reinstall")
}
