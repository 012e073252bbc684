package village

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// The marker is read back from the runtime's and kubelet's wrappings of
// the plugin's message; text that only mentions village is no marker.
func TestParseError(t *testing.T) {
	msg := markError(Plugin, types.NewError(types.ErrTryAgainLater, `"macvlan.pods" is "annotated", so …`, "")).(*types.Error).Msg
	for _, tc := range []struct {
		text string
		want Marked
		ok   bool
	}{
		{msg, Marked{Plugin, 11}, true},
		{`Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox "0a1b": plugin type="village" name="village" failed (add): ` + msg, Marked{Plugin, 11}, true},
		{ErrorPrefix("village-ipam", 100) + "range full", Marked{"village-ipam", 100}, true},
		{`plugin type="village" failed (add): failed to find plugin "village-ipam" in path`, Marked{}, false},
		{"[village-cni plugin=village code=x] no", Marked{}, false},
	} {
		got, ok := ParseError(tc.text)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseError(%q) = %+v, %v; want %+v, %v", tc.text, got, ok, tc.want, tc.ok)
		}
	}
}

// Every verb's error carries the marker with the CNI code skel prints: a
// *types.Error in the chain keeps its code and details, anything else is
// 999 (skel's rule).
func TestMarkedVerbs(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code uint
		msg  string
	}{
		{types.NewError(types.ErrTryAgainLater, "later", "d"), 11, "later"},
		{fmt.Errorf("wrapped: %w", types.NewError(101, "taken", "outside-pool")), 101, "taken"},
		{errors.New("plain"), types.ErrInternal, "plain"},
	} {
		f := marked(Plugin, skel.CNIFuncs{Add: func(*skel.CmdArgs) error { return tc.err }})
		var e *types.Error
		if err := f.Add(&skel.CmdArgs{}); !errors.As(err, &e) || e.Code != tc.code || e.Msg != ErrorPrefix(Plugin, tc.code)+tc.msg {
			t.Errorf("%v: %v, want code %d and message %q", tc.err, err, tc.code, ErrorPrefix(Plugin, tc.code)+tc.msg)
		}
		if m, ok := ParseError(e.Error()); !ok || m.Code != tc.code || m.Plugin != Plugin {
			t.Errorf("%v: marker %+v %v", tc.err, m, ok)
		}
	}
	if f := marked(Plugin, skel.CNIFuncs{Add: func(*skel.CmdArgs) error { return nil }}); f.Add(&skel.CmdArgs{}) != nil || f.Del != nil {
		t.Error("success or an absent verb changed")
	}
}
