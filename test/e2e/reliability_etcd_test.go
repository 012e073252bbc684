package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/etcdclient"
	"github.com/village-cni/village/pkg/netsetup"
)

func countKeys(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	must(t, err, "counting %s", prefix)
	return r.Count
}

// TestEtcdStoppedDuringChurn runs village (etcd store) through libcni with
// 4 workers churning pods on a node whose etcd listens inside the node
// namespace, and stops etcd in the middle. Before: every verb succeeds.
// While it is down: every ADD fails with code 11 within the store's bounded
// wait and leaves no interface or veth behind; DEL fails with code 11 too
// (the allocation cannot be released yet) but has removed the pod's links.
// Once etcd is back, the runtime's retried DELs succeed and no allocation
// is left in etcd.
func TestEtcdStoppedDuringChurn(t *testing.T) {
	n := NewNode(t)
	srv := etcdtest.StartIn(t, n.NS, "127.0.0.1")
	cli := srv.ClientIn(t, n.NS)
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"echurn","plugins":[{"type":"village","bridge":"echurn0","isGateway":true,
		"ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.70.0.0/27"}]],
		"store":{"type":"etcd","endpoints":%q,"prefix":"/soak","nodeName":"node-a"}}}]}`, srv.Endpoints))
	const workers = 4
	pods := make([]*Pod, workers)
	for i := range pods {
		pods[i] = n.NewPod()
	}
	var stopped atomic.Bool
	var mu sync.Mutex
	var ok, addFail, delFail int
	var bad []string
	var retry []*Pod // attachments whose DEL the runtime has to repeat
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(p *Pod) {
			defer wg.Done()
			for i := 0; ; i++ {
				p.ID = fmt.Sprintf("echurn-%d-%d", w, i)
				wasStopped := stopped.Load()
				_, err := n.Add(l, p)
				if err != nil {
					mu.Lock()
					defer mu.Unlock()
					var te *types.Error
					switch {
					case !wasStopped && !stopped.Load():
						bad = append(bad, fmt.Sprintf("ADD with etcd up: %v", err))
					case !errors.As(err, &te) || te.Code != types.ErrTryAgainLater || !strings.Contains(te.Msg, "etcd"):
						bad = append(bad, fmt.Sprintf("ADD with etcd down: %v, want code 11 naming etcd", err))
					}
					addFail++
					retry = append(retry, &Pod{NS: p.NS, ID: p.ID, IfName: p.IfName})
					return // one failed ADD per worker after the stop
				}
				if err := n.Del(l, p); err != nil {
					mu.Lock()
					var te *types.Error
					if !stopped.Load() {
						bad = append(bad, fmt.Sprintf("DEL with etcd up: %v", err))
					} else if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
						bad = append(bad, fmt.Sprintf("DEL with etcd down: %v, want code 11", err))
					}
					delFail++
					retry = append(retry, &Pod{NS: p.NS, ID: p.ID, IfName: p.IfName})
					mu.Unlock()
					if out := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(out, "eth0") {
						t.Errorf("DEL with etcd down left eth0: %s", out)
					}
					continue
				}
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}(pods[w])
	}
	// Stop etcd once every worker could have finished two pairs with it up
	// (the condition, not a sleep; 120 s guards against a hang).
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		done, failed := ok, len(bad)
		mu.Unlock()
		if done >= 2*workers || failed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d ADD/DEL pairs with etcd up after 120s", done)
		}
	}
	mu.Lock()
	before := ok
	mu.Unlock()
	stopped.Store(true)
	srv.Stop()
	wg.Wait()
	t.Logf("%d ADD/DEL pairs with etcd up; after the stop %d ADDs and %d DELs failed", before, addFail, delFail)
	if len(bad) > 0 {
		t.Fatalf("%d wrong outcomes:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if before == 0 {
		t.Fatal("no ADD/DEL pair completed before etcd was stopped")
	}
	// Nothing of the failed ADDs on the node.
	for _, p := range pods {
		if out := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(out, "eth0") {
			t.Errorf("failed ADD left eth0 in %s: %s", p.ID, out)
		}
		if _, err := testenv.IP(n.NS, "link", "show", netsetup.HostVethName(p.ID, "eth0")); err == nil {
			t.Errorf("failed ADD left the host veth of %s", p.ID)
		}
	}
	// etcd back: the runtime's retried DELs release everything.
	srv.Restart()
	for _, p := range retry {
		must(t, n.Del(l, p), "DEL %s retried once etcd is back", p.ID)
	}
	if c := countKeys(t, cli, "/soak/ipam/echurn/ips/"); c != 0 {
		t.Fatalf("%d allocations left in etcd after the retried DELs", c)
	}
	t.Logf("etcd restarted: %d retried DELs succeeded, no allocation left", len(retry))
}

// TestEtcdRestartDuringIPAMChurn churns village-ipam (etcd store, through
// the village-ipam-etcd helper) with 4 workers while etcd is stopped and
// started again. The runtime's behaviour is modelled: a failed DEL is
// retried until it succeeds, a failed ADD is followed by DEL. Afterwards no
// allocation is left in etcd and the whole range can be filled. The plugins
// run in the test's own namespace, where this etcd listens: village-ipam
// changes no network configuration.
func TestEtcdRestartDuringIPAMChurn(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := srv.ClientConfig()
	cli, err := etcdclient.New(cfg)
	must(t, err, "etcd client")
	t.Cleanup(func() { cli.Close() })
	pod := testenv.NewNS(t) // CNI_NETNS must name something; IPAM does not enter it
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"erestart","ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.71.0.0/27"}]],
		"store":{"type":"etcd","endpoints":%q,"prefix":"/soak","nodeName":"node-b"}}}`, srv.Endpoints))
	run := func(cmd, id string) testenv.Output {
		return testenv.Exec(t, testenv.Call{Bin: testenv.Bins(t) + "/village-ipam", Command: cmd, ContainerID: id, IfName: "eth0",
			Netns: pod.Path(), Path: testenv.CNIPath(t), Stdin: conf})
	}
	// Warm-up (builds the binaries when this test runs alone): the outage
	// must meet running verbs, not a build.
	if out := run("ADD", "warm"); out.ExitCode != 0 {
		t.Fatalf("warm-up ADD: %s", out.Stdout)
	}
	if out := run("DEL", "warm"); out.ExitCode != 0 {
		t.Fatalf("warm-up DEL: %s", out.Stdout)
	}
	const workers = 4
	var restarted atomic.Bool
	var mu sync.Mutex
	var bad []string
	var pairs, addFail, delRetries atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			after := 0 // pairs done since the restart
			for i := 0; after < 5; i++ {
				if restarted.Load() {
					after++
				}
				id := fmt.Sprintf("er-%d-%d", w, i)
				out := run("ADD", id)
				if out.ExitCode != 0 {
					addFail.Add(1)
					if e, err := decodeErr(out); err != nil || e.Code != types.ErrTryAgainLater {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("ADD %s: %s (want code 11)", id, out.Stdout))
						mu.Unlock()
					}
				}
				for try := 0; ; try++ { // DEL until it succeeds
					out := run("DEL", id)
					if out.ExitCode == 0 {
						break
					}
					delRetries.Add(1)
					if e, err := decodeErr(out); err != nil || e.Code != types.ErrTryAgainLater || try > 300 {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("DEL %s (try %d): %s", id, try, out.Stdout))
						mu.Unlock()
						return
					}
					time.Sleep(200 * time.Millisecond) // the runtime's retry pace
				}
				pairs.Add(1)
			}
		}()
	}
	// Stop etcd once every worker could have done a pair with it up, and
	// start it again once the outage has made verbs fail (conditions, not
	// sleeps; 120 s guards against a hang).
	waitFor(t, 2*time.Minute, "a pair per worker with etcd up", func() (bool, string) {
		return pairs.Load() >= workers, fmt.Sprintf("%d pairs", pairs.Load())
	})
	srv.Stop()
	waitFor(t, 2*time.Minute, "verbs failing against the stopped etcd", func() (bool, string) {
		return addFail.Load()+delRetries.Load() >= workers, fmt.Sprintf("%d failed ADDs, %d DEL retries", addFail.Load(), delRetries.Load())
	})
	srv.Restart()
	restarted.Store(true)
	wg.Wait()
	t.Logf("%d ADD/DEL pairs; %d ADDs failed while etcd was down, %d DELs retried", pairs.Load(), addFail.Load(), delRetries.Load())
	if len(bad) > 0 {
		t.Fatalf("%d wrong outcomes:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if addFail.Load()+delRetries.Load() == 0 {
		t.Fatal("no verb met the stopped etcd: the outage tested nothing")
	}
	if c := countKeys(t, cli, "/soak/ipam/erestart/ips/"); c != 0 {
		t.Fatalf("%d allocations left in etcd after every DEL succeeded", c)
	}
	// 10.71.0.0/27: .2-.30, 29 addresses.
	seen := map[string]bool{}
	addr := regexp.MustCompile(`"address":\s*"([^"]+)"`)
	for i := range 29 {
		out := run("ADD", fmt.Sprintf("fill-%d", i))
		if out.ExitCode != 0 {
			t.Fatalf("fill %d: %s", i, out.Stdout)
		}
		ip := addr.FindStringSubmatch(string(out.Stdout))[1]
		if seen[ip] {
			t.Fatalf("%s handed out twice", ip)
		}
		seen[ip] = true
	}
	if out := run("ADD", "fill-extra"); out.ExitCode == 0 {
		t.Fatalf("ADD past a full range succeeded: %s", out.Stdout)
	}
}

func decodeErr(out testenv.Output) (*types.Error, error) {
	e := &types.Error{}
	if err := json.Unmarshal(out.Stdout, e); err != nil {
		return nil, err
	}
	if strings.Contains(string(out.Stderr), "panic") {
		return nil, fmt.Errorf("panic: %s", out.Stderr)
	}
	return e, nil
}

// slowProxy forwards 127.0.0.1:<port> to target, holding every chunk of
// data, in both directions, for the current delay: a slow etcd (or a slow
// network to it) without touching any interface.
type slowProxy struct {
	ln    net.Listener
	delay atomic.Int64 // nanoseconds
}

func newSlowProxy(t *testing.T, target string) *slowProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err, "listen")
	p := &slowProxy{ln: ln}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			conns.Add(2)
			pipe := func(dst, src net.Conn) {
				defer conns.Done()
				defer dst.Close()
				defer src.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(p.delay.Load()))
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
	return p
}

// TestEtcdSlowDuringIPAMChurn churns village-ipam (etcd store) with 4
// workers through a proxy that makes etcd slow: at 100 ms per exchange
// every verb still succeeds; past the store's 5 s bound verbs fail with
// code 11 in bounded time instead of hanging; once etcd is fast again the
// runtime's retried DELs succeed, no allocation is left and the range
// fills exactly, without a duplicate.
func TestEtcdSlowDuringIPAMChurn(t *testing.T) {
	srv := etcdtest.Start(t)
	cli, err := etcdclient.New(srv.ClientConfig())
	must(t, err, "etcd client")
	t.Cleanup(func() { cli.Close() })
	proxy := newSlowProxy(t, strings.TrimPrefix(srv.Endpoints[0], "http://"))
	pod := testenv.NewNS(t)
	testenv.CNIPath(t) // build before the churn starts
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"eslow","ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.76.0.0/27"}]],
		"store":{"type":"etcd","endpoints":["http://%s"],"prefix":"/slow","nodeName":"node-c"}}}`, proxy.ln.Addr()))
	run := func(cmd, id string) testenv.Output {
		return testenv.Exec(t, testenv.Call{Bin: testenv.Bins(t) + "/village-ipam", Command: cmd, ContainerID: id, IfName: "eth0",
			Netns: pod.Path(), Path: testenv.CNIPath(t), Stdin: conf})
	}
	churn := func(phase string, pairs int, wantOK bool) (failed int) {
		var mu sync.Mutex
		var bad []string
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range pairs {
					id := fmt.Sprintf("%s-%d-%d", phase, w, i)
					for _, verb := range []string{"ADD", "DEL"} {
						out := run(verb, id)
						mu.Lock()
						if out.ExitCode != 0 {
							failed++
							e, err := decodeErr(out)
							if wantOK || err != nil || e.Code != types.ErrTryAgainLater {
								bad = append(bad, fmt.Sprintf("%s %s %s: %s", phase, verb, id, out.Stdout))
							}
						}
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("%d wrong outcomes:\n%s", len(bad), strings.Join(bad, "\n"))
		}
		return failed
	}
	churn("warm", 1, true)
	proxy.delay.Store(int64(100 * time.Millisecond))
	churn("slow", 3, true)
	proxy.delay.Store(int64(6 * time.Second))
	// The store's bound is the event: verbs fail with code 11 (checked in
	// churn) rather than hang; no duration is asserted.
	failed := churn("stuck", 1, false)
	if failed == 0 {
		t.Fatal("no verb failed with etcd 6 s per exchange: the store's bound was not exercised")
	}
	proxy.delay.Store(0)
	t.Logf("%d of 8 verbs failed with code 11 at 6 s per exchange", failed)
	// The runtime retries DEL for every pod whose ADD or DEL failed.
	for w := range 4 {
		id := fmt.Sprintf("stuck-%d-0", w)
		if out := run("DEL", id); out.ExitCode != 0 {
			t.Fatalf("DEL %s once etcd is fast again: %s", id, out.Stdout)
		}
	}
	if c := countKeys(t, cli, "/slow/ipam/eslow/ips/"); c != 0 {
		t.Fatalf("%d allocations left after every DEL succeeded", c)
	}
	seen := map[string]bool{}
	addr := regexp.MustCompile(`"address":\s*"([^"]+)"`)
	for i := range 29 {
		out := run("ADD", fmt.Sprintf("fill-%d", i))
		if out.ExitCode != 0 {
			t.Fatalf("fill %d: %s", i, out.Stdout)
		}
		ip := addr.FindStringSubmatch(string(out.Stdout))[1]
		if seen[ip] {
			t.Fatalf("%s handed out twice", ip)
		}
		seen[ip] = true
	}
}
