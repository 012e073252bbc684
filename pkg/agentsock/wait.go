package agentsock

import (
	"context"
	"fmt"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
)

// AskWaiting is Ask, asked again every nodelocal.AgentPoll while nobody
// answers on path (CodeNoAgent: no socket yet, or nobody listening on it),
// until bound has passed since the first try or ctx is done. After a reboot
// the runtime sends ADDs before villaged is back (the conflist on disk
// already says the node can network pods): they wait for the agent here
// instead of failing their sandboxes. Any other outcome, a refusal
// included, is returned at once. At the bound the error is an *Error with
// CodeNoAgent that names the socket and the bound it waited.
func AskWaiting(ctx context.Context, path string, req Request, bound time.Duration) (*Response, error) {
	start := time.Now()
	for {
		resp, err := Ask(ctx, path, req)
		if ErrorCode(err) != CodeNoAgent {
			return resp, err
		}
		waited := time.Since(start)
		if waited >= bound || ctx.Err() != nil {
			return nil, &Error{Socket: path, Code: CodeNoAgent, Retry: true, Msg: fmt.Sprintf(
				"waited %s (the bound, $%s) for village's node agent (villaged run) to answer on %s: %v",
				waited.Round(time.Millisecond), nodelocal.AgentWaitEnv, path, err)}
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(nodelocal.AgentPoll, bound-waited)):
		}
	}
}
