package village

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/pkg/cleanup"
	"github.com/village-cni/village/pkg/pluginexec"
)

// claim is the IPAM ADD of one pod interface (eth0, or the LAN interface),
// in the order an ADD uses it: forkClaim starts the plugin without its
// input, send gives it the input once the config is known to be good,
// answer reads the addresses as soon as the plugin prints them, and wait
// reaps it before the ADD reports them. forkClaim pushes the claim's
// rollback on the ADD's cleanup stack, so a failed ADD ends every claim the
// same way whatever step it failed at.
type claim struct {
	call ipamCall
	proc *pluginexec.Proc
	sent bool
	// live: the interface belongs to an attachment that lives (a previous
	// ADD of this container made it), so a failed ADD leaves the addresses
	// the plugin handed back to the pod that holds them. It stays true until
	// the ADD has looked, so a failure before then releases nothing and
	// leaves the addresses to the runtime's DEL.
	live bool

	read   bool // answer has run: res or err is the plugin's answer
	res    *current.Result
	err    error
	cancel context.CancelFunc // ends the deadline of the read, once reaped
}

// forkClaim forks the IPAM plugin of call for an ADD, without its input,
// and pushes its rollback on undo.
func forkClaim(call ipamCall, undo *cleanup.Stack) (*claim, error) {
	proc, err := call.start("ADD")
	if err != nil {
		return nil, err
	}
	c := &claim{call: call, proc: proc, live: true}
	undo.Push(fmt.Sprintf("end the IPAM %q claim of %q", call.Type, call.IfName), c.rollback)
	return c, nil
}

// send gives the plugin its input: from now on it may claim addresses.
func (c *claim) send() {
	c.sent = true
	c.proc.Send()
}

// abort kills a plugin that was never sent its input: it has read nothing,
// so it has claimed nothing. Its rollback then has nothing left to do.
func (c *claim) abort() {
	if c != nil && !c.sent {
		c.proc.Abort()
	}
}

// answer returns the addresses the plugin printed, reading them the first
// time it is called (later calls return the same). The process may still be
// exiting: the addresses are the plugin's answer only once wait returns
// nil. A plugin that failed has been reaped and its own error is returned.
func (c *claim) answer() (*current.Result, error) {
	if c.read {
		return c.res, c.err
	}
	c.read, c.sent = true, true // Output sends the input if send did not
	var ctx context.Context
	ctx, c.cancel = ipamTimeout()
	res, err := c.decode(c.proc.Output(ctx))
	if err != nil {
		if werr := c.wait(); werr != nil {
			err = werr
		}
		c.err = err
		return nil, err
	}
	c.res = res
	return res, nil
}

// decode checks the plugin's answer: a result village can read, with at
// least one address.
func (c *claim) decode(r types.Result, err error) (*current.Result, error) {
	if err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("IPAM plugin %q returned a result village cannot read: %w", c.call.Type, err)
	}
	if len(res.IPs) == 0 {
		return nil, fmt.Errorf("IPAM plugin %q returned no IP address for %q", c.call.Type, c.call.IfName)
	}
	return res, nil
}

// wait reaps the plugin (reading its answer first if answer did not):
// nil when it answered with addresses and exited 0.
func (c *claim) wait() error {
	if _, err := c.answer(); err != nil {
		return err
	}
	err := c.proc.Wait()
	c.cancel()
	if err != nil {
		return wrapIPAM(c.call.Type, "ADD", err)
	}
	return nil
}

// rollback ends the claim of a failed ADD: a plugin never sent its input is
// killed; one that was is read and reaped, and the addresses it handed out
// are released (IPAM DEL) unless they belong to a live attachment. A
// plugin that failed claimed nothing.
func (c *claim) rollback() error {
	if !c.sent {
		c.proc.Abort()
		return nil
	}
	res, err := c.answer()
	_ = c.wait() // a failed exit is the ADD's error already, or changes nothing here
	if err != nil || res == nil || c.live {
		return nil
	}
	ctx, cancel := ipamTimeout()
	defer cancel()
	return c.call.Del(ctx)
}
