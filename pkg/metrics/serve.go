package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Probes are the two questions the kubelet asks the agent. Live answers
// /healthz (liveness: is the process working, or should it be restarted);
// Ready answers /readyz (readiness: can this node network pods now). A nil
// func, or one that returns nil, answers 200 "ok"; an error answers 503
// with the reason.
type Probes struct {
	Live  func() error
	Ready func() error
}

// Handler serves /metrics from the registry and /healthz and /readyz from p.
func (m *Metrics) Handler(p Probes) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.HandleFunc("/healthz", probe(p.Live, "unhealthy"))
	mux.HandleFunc("/readyz", probe(p.Ready, "not ready"))
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "villaged: /metrics (Prometheus), /healthz (liveness), /readyz (readiness)")
	})
	return mux
}

// probe answers one probe endpoint from check.
func probe(check func() error, bad string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if check != nil {
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "%s: %v\n", bad, err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	}
}

// Serve listens on addr (DefaultAddr when empty) and serves Handler until
// ctx is done, then shuts down gracefully. It returns nil after a shutdown
// asked for by ctx and an error naming the address when it cannot listen or
// the server fails.
func (m *Metrics) Serve(ctx context.Context, addr string, p Probes) error {
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return m.ServeListener(ctx, ln, p)
}

// ServeListener is Serve on a listener the caller opened; it closes ln.
func (m *Metrics) ServeListener(ctx context.Context, ln net.Listener, p Probes) error {
	srv := &http.Server{
		Handler:           m.Handler(p),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("metrics: shut down server on %s: %w", ln.Addr(), err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	}
	return nil
}
