package kube_test

import (
	"testing"

	"github.com/village-cni/village/internal/kubecluster"
)

func TestSmoke(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Backend: "host-gw"})
	out, err := c.Kubectl("get", "pods", "-A", "-o", "wide")
	t.Logf("%s %v", out, err)
}
