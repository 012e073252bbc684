package landhcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/landhcp/wire"
)

// connDeadline bounds one connection: the longest request, an acquire,
// plus room to answer.
const connDeadline = acquireTimeout + 30*time.Second

// Serve answers the plugin on the unix socket path until ctx ends. The
// socket is 0600 and every peer's credentials are checked: only root
// (the runtime running the plugin) may ask, since a request opens sockets
// in the pod namespace it names.
func Serve(ctx context.Context, path string, m *Manager) error {
	l, err := agentsock.Listen(path)
	if err != nil {
		return fmt.Errorf("DHCP %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("DHCP socket %s: %w", path, err)
		}
		wg.Go(func() { serveConn(ctx, conn, m) })
	}
}

func serveConn(ctx context.Context, conn *net.UnixConn, m *Manager) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(connDeadline))
	var resp wire.Response
	if err := peerIsRoot(conn); err != nil {
		resp.Error = err.Error()
	} else if req, err := wire.ReadRequest(conn); err != nil {
		resp.Error = err.Error()
	} else {
		resp = m.Handle(ctx, req)
	}
	_ = json.NewEncoder(conn).Encode(resp)
}

// peerIsRoot checks the connecting process's user (SO_PEERCRED).
func peerIsRoot(conn *net.UnixConn) error {
	uid, err := agentsock.PeerUID(conn)
	if err != nil {
		return fmt.Errorf("reading the peer's credentials: %w", err)
	}
	if uid != 0 {
		return fmt.Errorf("only root may use the DHCP socket (peer uid %d)", uid)
	}
	return nil
}
