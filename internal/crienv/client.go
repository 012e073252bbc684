package crienv

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime returns a CRI v1 runtime client on this containerd's socket, the
// way the kubelet talks to it (no crictl process in between), and a function
// that closes the connection.
func (e *Env) Runtime() (runtimeapi.RuntimeServiceClient, func() error, error) {
	conn, err := grpc.NewClient("unix://"+e.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("CRI client for %s: %w", e.Socket, err)
	}
	return runtimeapi.NewRuntimeServiceClient(conn), conn.Close, nil
}
