package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/village-cni/village/internal/crienv"
)

// runtimeRow: pod start and stop as a kubelet sees them. One containerd per
// suite (each in its own node namespace, see internal/crienv), the same
// conflist shape (isGateway, ipMasq, a /24, no portmap), pods started over
// CRI gRPC one at a time, alternating suites: RunPodSandbox (netns, the CNI
// ADD, the pause container), StopPodSandbox (the CNI DEL, stopping pause) and
// RemovePodSandbox (containerd's second DEL, with an empty CNI_NETNS). The
// plugin's own share is read from Village's logFile (duration_ms of each
// verb); the reference plugins have no such log.
func runtimeRow(l *lab, o options, v, r *suite, s samples, t *table) error {
	logf("runtime: %d pods per suite through containerd (CRI)", o.criPods)
	images := filepath.Join(l.tmp, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return err
	}
	pauseTar, _, err := crienv.BuildImages(o.moduleRoot, images)
	if err != nil {
		return err
	}
	ctx := context.Background()
	clients := map[*suite]runtimeapi.RuntimeServiceClient{}
	logFile := filepath.Join(l.tmp, "village-cri.log")
	for _, su := range []*suite{v, r} {
		node, err := l.newNS("cri" + su.short)
		if err != nil {
			return err
		}
		extra := ""
		if su == v {
			extra = fmt.Sprintf(`,"logFile":%q`, logFile)
		}
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"%scri","plugins":[{"type":%q,"bridge":"cri0","isGateway":true,"ipMasq":true%s,
  "ipam":{"type":%q,"dataDir":%q,"subnet":"10.94.0.0/24","routes":[{"dst":"0.0.0.0/0"}]}}]}`,
			su.netPrefix, su.main, extra, su.ipam, filepath.Join(su.dataDir, "cri"))
		env, err := crienv.Start(crienv.Options{
			Dir:   filepath.Join(l.tmp, "containerd-"+su.name),
			NetNS: netnsPath(node),
			CNIBins: map[string]string{
				su.main: filepath.Join(su.binDir, su.main), su.ipam: filepath.Join(su.binDir, su.ipam),
				"loopback": filepath.Join(su.binDir, "loopback"),
			},
			Confs:        map[string][]byte{"10-bench.conflist": []byte(conf)},
			SandboxImage: crienv.PauseImage,
			CrictlBin:    o.crictl,
		})
		if env != nil {
			defer func() {
				if err := env.Stop(); err != nil {
					logf("stopping containerd of %s: %v", su.name, err)
				}
			}()
		}
		if err != nil {
			return err
		}
		if err := env.Import(pauseTar); err != nil {
			return err
		}
		c, closeConn, err := env.Runtime()
		if err != nil {
			return err
		}
		defer closeConn()
		clients[su] = c
		// One pod first, not measured: the bridge, masquerade and the first
		// unpack of the pause image exist on any node that already runs pods.
		if _, _, _, err := podCycle(ctx, c, su, "warm", filepath.Join(l.tmp, "pods-"+su.name)); err != nil {
			return fmt.Errorf("%s warm-up pod: %w", su.name, err)
		}
	}
	for i := 0; i < o.criPods; i++ {
		for _, su := range order(i, v, r) {
			run, stop, rm, err := podCycle(ctx, clients[su], su, fmt.Sprintf("p%d", i), filepath.Join(l.tmp, "pods-"+su.name))
			if err != nil {
				return fmt.Errorf("%s pod %d: %w", su.name, i, err)
			}
			s.add(su.short+".cri.run", ms(run))
			s.add(su.short+".cri.stop", ms(stop))
			s.add(su.short+".cri.rm", ms(rm))
		}
	}
	if err := pluginTimes(logFile, s); err != nil {
		return err
	}
	run, stop := s.med("v.cri.run"), s.med("v.cri.stop")
	t.add(row2(fmt.Sprintf("RunPodSandbox via containerd 1.6 CRI (%d pods, sequential)", o.criPods), run, s.med("r.cri.run"), "ms"))
	t.add(row2("StopPodSandbox via CRI (the CNI DEL)", stop, s.med("r.cri.stop"), "ms"))
	t.add(row2("RemovePodSandbox via CRI (second DEL, empty CNI_NETNS)", s.med("v.cri.rm"), s.med("r.cri.rm"), "ms"))
	add, del := s.med("v.cri.plugin.add"), s.med("v.cri.plugin.del")
	t.add(row2(fmt.Sprintf("village ADD inside RunPodSandbox (logFile): %.0f%% of it", 100*add/run), add, math.NaN(), "ms"))
	t.add(row2(fmt.Sprintf("village DEL inside StopPodSandbox (logFile): %.0f%% of it", 100*del/stop), del, math.NaN(), "ms"))
	return nil
}

// podCycle runs, stops and removes one pod sandbox and times each call.
func podCycle(ctx context.Context, c runtimeapi.RuntimeServiceClient, su *suite, name, logDir string) (run, stop, rm time.Duration, err error) {
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: su.name + "-" + name},
		Hostname:     name,
		LogDirectory: filepath.Join(logDir, name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	resp, err := c.RunPodSandbox(cctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	run = time.Since(start)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("RunPodSandbox: %w", err)
	}
	id := resp.PodSandboxId
	start = time.Now()
	if _, err := c.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return 0, 0, 0, fmt.Errorf("StopPodSandbox: %w", err)
	}
	stop = time.Since(start)
	start = time.Now()
	if _, err := c.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return 0, 0, 0, fmt.Errorf("RemovePodSandbox: %w", err)
	}
	rm = time.Since(start)
	return run, stop, rm, nil
}

// pluginTimes reads the village plugin's own duration of each measured ADD
// and of each DEL that had a netns (the StopPodSandbox one); the lines come
// in pod order (one pod at a time).
func pluginTimes(logFile string, s samples) error {
	f, err := os.Open(logFile)
	if err != nil {
		return fmt.Errorf("village's logFile: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	adds, dels := 0, 0
	for sc.Scan() {
		var l struct {
			Msg, Level, Plugin, Netns string
			Duration                  float64 `json:"duration_ms"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Plugin != "village" {
			continue
		}
		// The first ADD and DEL are the warm-up pod's.
		switch {
		case l.Msg == "ADD ok":
			if adds++; adds > 1 {
				s.add("v.cri.plugin.add", l.Duration)
			}
		case l.Msg == "DEL ok" && l.Netns != "":
			if dels++; dels > 1 {
				s.add("v.cri.plugin.del", l.Duration)
			}
		case l.Level == "ERROR":
			return fmt.Errorf("village logged a failure: %s", sc.Text())
		}
	}
	return sc.Err()
}
