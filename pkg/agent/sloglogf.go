package agent

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
)

// logfHandler writes the lansvc packages' slog records as the agent's own
// log lines (logf adds the one timestamp): "LAN Services (speaker):
// message key=value ...", and "WARNING: " before the message of a warning
// or an error, as every other part of the agent writes them. Debug
// records are dropped.
type logfHandler struct {
	logf   func(string, ...any)
	prefix string
	attrs  []slog.Attr
	group  string
}

func newLogfHandler(logf func(string, ...any), prefix string) *logfHandler {
	return &logfHandler{logf: logf, prefix: prefix}
}

func (h *logfHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *logfHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(h.prefix)
	var rest []slog.Attr
	component := ""
	add := func(a slog.Attr) bool {
		if a.Key == "component" && component == "" {
			component = a.Value.String()
		} else {
			rest = append(rest, a)
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool {
		if h.group != "" {
			a.Key = h.group + "." + a.Key
		}
		return add(a)
	})
	if component != "" {
		b.WriteString(" (" + component + ")")
	}
	b.WriteString(": ")
	if r.Level >= slog.LevelWarn {
		b.WriteString("WARNING: ")
	}
	b.WriteString(r.Message)
	for _, a := range rest {
		v := a.Value.Resolve().String()
		if v == "" || strings.ContainsAny(v, " \t\n\"=") {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, " %s=%s", a.Key, v)
	}
	h.logf("%s", b.String())
	return nil
}

func (h *logfHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	if h.group != "" {
		for i := len(h.attrs); i < len(c.attrs); i++ {
			c.attrs[i].Key = h.group + "." + c.attrs[i].Key
		}
	}
	return &c
}

func (h *logfHandler) WithGroup(name string) slog.Handler {
	c := *h
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}
