package helm

import (
	"testing"

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
	nc, _ := villageEntryWith(t, docs, map[string]string{"BACKEND": env(inst, "BACKEND")})
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
