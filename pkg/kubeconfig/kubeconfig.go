// Package kubeconfig is how every Village component reaches the Kubernetes
// API: the client configuration (a kubeconfig file, or in-cluster) and the
// prefix of the labels and annotations Village owns. It is a leaf on
// purpose: village-ipam-kube needs these two and nothing of the node
// registry, whose etcd side would link the etcd client and gRPC into a
// binary exec'd for every pod.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Prefix starts every label and annotation key Village writes.
const Prefix = "village.cni.io/"

// AnnotationLANAddress is where the agent writes a LAN pod's address
// ("net1=192.168.50.210/24"); the NetworkPolicy controller reads it to
// leave that interface alone.
const AnnotationLANAddress = Prefix + "lan-address"

// REST loads the client configuration: the kubeconfig file at path, or the
// in-cluster configuration when path is "".
func REST(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given and not in a pod: %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return rc, nil
}
