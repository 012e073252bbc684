package landhcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("DHCP socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the stale DHCP socket %s: %w", path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("DHCP socket %s: %w", path, err)
	}
	// Between bind and chmod the socket has the umask's mode; the peer
	// check below refuses anyone but root all the same.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("DHCP socket %s: %w", path, err)
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
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("reading the peer's credentials: %w", cerr)
	}
	if cred.Uid != 0 {
		return fmt.Errorf("only root may use the DHCP socket (peer uid %d)", cred.Uid)
	}
	return nil
}
