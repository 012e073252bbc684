package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestLogfHandler(t *testing.T) {
	for name, tc := range map[string]struct {
		log  func(*slog.Logger)
		want string
	}{
		"info with component": {func(l *slog.Logger) {
			l.With("component", "members").Info("agent alive", "node", "node1", "addr", "192.168.79.11:7947")
		}, "LAN Services (members): agent alive node=node1 addr=192.168.79.11:7947"},
		"warning, quoted value": {func(l *slog.Logger) {
			l.Warn("address in use by another host", "address", "192.168.79.240", "err", errors.New("in use by 7a:ba"))
		}, `LAN Services: WARNING: address in use by another host address=192.168.79.240 err="in use by 7a:ba"`},
		"error is a warning": {func(l *slog.Logger) { l.Error("closing", "n", 2) }, "LAN Services: WARNING: closing n=2"},
		"debug dropped":      {func(l *slog.Logger) { l.Debug("joining peer") }, ""},
		"group":              {func(l *slog.Logger) { l.WithGroup("g").With("a", 1).Info("m", "b", "") }, `LAN Services: m g.a=1 g.b=""`},
	} {
		t.Run(name, func(t *testing.T) {
			var lines []string
			logf := func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }
			tc.log(slog.New(newLogfHandler(logf, "LAN Services")))
			if got := strings.Join(lines, "\n"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
