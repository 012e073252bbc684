package kubecluster

import (
	"testing"
)

func TestDualStackRanges(t *testing.T) {
	if got := (Options{}).ClusterCIDRs() + " " + (Options{}).ServiceCIDRs(); got != ClusterCIDR+" "+ServiceCIDR {
		t.Errorf("single stack: %s", got)
	}
	o := Options{DualStack: true}
	if got, want := o.ClusterCIDRs()+" "+o.ServiceCIDRs(), "10.244.0.0/16,fd00:10:244::/56 10.96.0.0/16,fd00:10:96::/112"; got != want {
		t.Errorf("dual stack: %s, want %s", got, want)
	}
}
