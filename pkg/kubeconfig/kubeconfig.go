// Package kubeconfig is how every Village component reaches the Kubernetes
// API: the client configuration (a kubeconfig file, or in-cluster). The
// names Village owns in the API are pkg/kubenames'. It is a leaf on
// purpose: village-ipam-kube needs it and nothing of the node registry,
// whose etcd side would link the etcd client and gRPC into a binary
// exec'd for every pod.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

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
