package netconf_test

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
)

// FuzzCNIArgs fuzzes CNI_ARGS alone against a good config: the runtime (or
// whoever can set the environment) controls it byte for byte. Every
// rejection is a coded CNI error; an accepted MAC is a unicast 6-byte
// address.
func FuzzCNIArgs(f *testing.F) {
	for _, s := range []string{
		"", "IgnoreUnknown=1", "IgnoreUnknown=true;K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=default",
		"MAC=0a:58:0a:f4:01:07", "MAC=01:00:5e:00:00:01", "MAC=zz", "MAC=0a:58:0a:f4:01:07:00:00",
		"FOO=bar", "garbage", "=", ";;;", "IgnoreUnknown=1;=x", "MAC=", "IP=10.0.0.5;IgnoreUnknown=1",
		"IgnoreUnknown=maybe", "MAC=0a:58:0a:f4:01:07;MAC=0a:58:0a:f4:01:08",
	} {
		f.Add(s)
	}
	stdin := []byte(`{"cniVersion":"1.1.0","name":"n","type":"village","ipam":{"type":"village-ipam","subnet":"10.0.0.0/24"}}`)
	f.Fuzz(func(t *testing.T, args string) {
		c, err := netconf.Parse(stdin, args)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code == 0 {
				t.Fatalf("CNI_ARGS %q: error %v (%T) is not a coded CNI error", args, err, err)
			}
			return
		}
		if c.MAC != nil && (len(c.MAC) != 6 || c.MAC[0]&1 != 0) {
			t.Fatalf("CNI_ARGS %q: accepted MAC %v", args, c.MAC)
		}
	})
}
