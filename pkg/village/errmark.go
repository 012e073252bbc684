package village

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// Every error a verb of the plugin returns starts its message with a fixed
// marker carrying the plugin's name and the CNI code:
//
//	[village-cni plugin=village code=11] "macvlan.pods" is "annotated", so …
//
// The runtime passes the message on inside its own wrapping (containerd:
// `failed to setup network for sandbox "…": plugin type="village" failed
// (add): <message>`), and so does the kubelet's FailedCreatePodSandBox
// Event, which keeps neither the code nor the details. ParseError finds
// the marker there: whose sandbox failed and with which code is read from
// the marker, never guessed from the wording.

// ErrorMarker starts the marker.
const ErrorMarker = "[village-cni plugin="

// Plugin is the plugin's name in the marker.
const Plugin = "village"

var markerRE = regexp.MustCompile(regexp.QuoteMeta(ErrorMarker) + `([a-z0-9-]+) code=([0-9]+)\]`)

// Marked is a marker read back from a message.
type Marked struct {
	Plugin string
	Code   uint
}

// ErrorPrefix is the marker of plugin's error with code, as it starts the
// message.
func ErrorPrefix(plugin string, code uint) string {
	return fmt.Sprintf("%s%s code=%d] ", ErrorMarker, plugin, code)
}

// ParseError finds the first marker in text (a CNI error's message or a
// runtime's or kubelet's wrapping of it).
func ParseError(text string) (Marked, bool) {
	m := markerRE.FindStringSubmatch(text)
	if m == nil {
		return Marked{}, false
	}
	code, err := strconv.ParseUint(m[2], 10, 32)
	if err != nil {
		return Marked{}, false
	}
	return Marked{Plugin: m[1], Code: uint(code)}, true
}

// markError is err as the CNI error skel prints (the *types.Error in
// err's chain, else code 999 with err's text, skel's own rule), its
// message starting with the marker of plugin.
func markError(plugin string, err error) error {
	if err == nil {
		return nil
	}
	var e *types.Error
	if !errors.As(err, &e) {
		e = types.NewError(types.ErrInternal, err.Error(), "")
	}
	return &types.Error{Code: e.Code, Msg: ErrorPrefix(plugin, e.Code) + e.Msg, Details: e.Details}
}

// marked wraps each verb of funcs so that its error carries the marker.
func marked(plugin string, funcs skel.CNIFuncs) skel.CNIFuncs {
	wrap := func(f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
		if f == nil {
			return nil
		}
		return func(args *skel.CmdArgs) error { return markError(plugin, f(args)) }
	}
	return skel.CNIFuncs{Add: wrap(funcs.Add), Del: wrap(funcs.Del), Check: wrap(funcs.Check), Status: wrap(funcs.Status), GC: wrap(funcs.GC)}
}
