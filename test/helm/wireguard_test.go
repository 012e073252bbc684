package helm

import (
	"encoding/json"
	"testing"

	"github.com/village-cni/village/pkg/install"
	"github.com/village-cni/village/pkg/netconf"
)

// TestWireGuardValues: backend wireguard renders a conflist Village's own
// parser accepts as the wireguard backend (no VXLAN keys in it), and the
// agent can keep its key and run wireguard-go: the key directory from the
// host, writable; /dev/net/tun; a writable UAPI socket directory. The
// other backends mount none of it.
func TestWireGuardValues(t *testing.T) {
	docs := render(t, nil, map[string]any{"backend": "wireguard"})
	ds := daemonSet(t, docs)
	agent := container(t, ds.Spec.Template.Spec.Containers, "agent")
	// The install container renders the template, with its BACKEND.
	inst := container(t, ds.Spec.Template.Spec.InitContainers, "install")
	vars := map[string]string{"NODE_NAME": "node-1", "DEFAULT_IFACE": "eth0", "BACKEND": env(inst, "BACKEND")}
	out, err := install.Render([]byte(conflistTemplate(t, docs)), func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatalf("render the conflist template: %v", err)
	}
	var list struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(out, &list); err != nil || len(list.Plugins) == 0 {
		t.Fatalf("conflist (%v):\n%s", err, out)
	}
	m := map[string]any{}
	if err := json.Unmarshal(list.Plugins[0], &m); err != nil {
		t.Fatal(err)
	}
	m["name"], m["cniVersion"] = list.Name, list.CNIVersion
	b, _ := json.Marshal(m)
	nc, err := netconf.Parse(b, "")
	if err != nil {
		t.Fatalf("the village entry is rejected by netconf.Parse: %v\n%s", err, out)
	}
	be, err := netconf.ParseBackend(nc.Backend)
	if err != nil || be.Type != netconf.BackendWireGuard || be.WireGuard == nil {
		t.Fatalf("backend %s: %+v (%v), want type wireguard accepted", nc.Backend, be, err)
	}
	if host, w := hostPathAt(t, &ds.Spec.Template.Spec, agent, "/var/lib/village/wireguard"); host != "/var/lib/village/wireguard" || !w {
		t.Errorf("agent's WireGuard key directory: host %s writable %v", host, w)
	}
	if host, _ := hostPathAt(t, &ds.Spec.Template.Spec, agent, "/dev/net/tun"); host != "/dev/net/tun" {
		t.Errorf("agent's /dev/net/tun is the host's %s", host)
	}
	var uapi bool
	for _, mnt := range agent.VolumeMounts {
		if mnt.MountPath == "/var/run/wireguard" && !mnt.ReadOnly {
			for _, v := range ds.Spec.Template.Spec.Volumes {
				uapi = uapi || v.Name == mnt.Name && v.EmptyDir != nil
			}
		}
	}
	if !uapi {
		t.Error("the agent has no writable /var/run/wireguard for wireguard-go's UAPI sockets")
	}

	for _, backend := range []string{"auto", "vxlan"} {
		a := container(t, daemonSet(t, render(t, nil, map[string]any{"backend": backend})).Spec.Template.Spec.Containers, "agent")
		for _, mnt := range a.VolumeMounts {
			if mnt.MountPath == "/dev/net/tun" || mnt.MountPath == "/var/lib/village/wireguard" {
				t.Errorf("backend %s mounts %s", backend, mnt.MountPath)
			}
		}
	}
}
