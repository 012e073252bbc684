package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestConfineVerdict: only a Forbidden from the admission policy
// village-agent proves confinement; an allowed probe, RBAC's refusal or no
// answer leave the agent unconfined.
func TestConfineVerdict(t *testing.T) {
	nodes := schema.GroupResource{Resource: "nodes"}
	for _, tc := range []struct {
		name     string
		err      error
		confined bool
		says     string
	}{
		{"policy refuses", apierrors.NewForbidden(nodes, "n1", errors.New("ValidatingAdmissionPolicy 'village-agent' with binding 'village-agent' denied request: no")), true, ""},
		{"probe allowed", nil, false, "NOT CONFINED"},
		{"RBAC refuses", apierrors.NewForbidden(nodes, "n1", errors.New(`User "x" cannot patch resource "nodes/status"`)), false, "not by the ValidatingAdmissionPolicy"},
		{"another policy refuses", apierrors.NewForbidden(nodes, "n1", errors.New("ValidatingAdmissionPolicy 'other' denied request: no")), false, "NOT CONFINED"},
		{"no answer", errors.New("connection refused"), false, "confinement unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := confineVerdict("n1", tc.err)
			if (got == nil) != tc.confined || (got != nil && !strings.Contains(got.Error(), tc.says)) {
				t.Errorf("verdict %v; want confined %v (saying %q)", got, tc.confined, tc.says)
			}
		})
	}
}

// TestWriteGate: reads and dry runs pass; a write reaches the server only
// once confinement is proved.
func TestWriteGate(t *testing.T) {
	var reached []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.Method+" "+r.URL.RawQuery)
	}))
	defer srv.Close()
	conf := newConfinement()
	conf.set(errors.New("NOT CONFINED: test"))
	c := &http.Client{Transport: writeGate{next: http.DefaultTransport, conf: conf}}
	do := func(method, query string) error {
		req, _ := http.NewRequestWithContext(context.Background(), method, srv.URL+"/api/v1/nodes/n1/status?"+query, nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := do(http.MethodGet, ""); err != nil {
		t.Fatalf("a read while unconfined: %v", err)
	}
	if err := do(http.MethodPatch, "dryRun=All"); err != nil {
		t.Fatalf("the dry-run probe while unconfined: %v", err)
	}
	if err := do(http.MethodPatch, ""); err == nil || !strings.Contains(err.Error(), "NOT CONFINED") {
		t.Fatalf("a write while unconfined: %v, want refused saying why", err)
	}
	if err := do(http.MethodPost, ""); err == nil {
		t.Fatal("a create while unconfined: sent")
	}
	conf.set(nil)
	if err := do(http.MethodPatch, ""); err != nil {
		t.Fatalf("a write once confined: %v", err)
	}
	want := []string{"GET ", "PATCH dryRun=All", "PATCH "}
	if strings.Join(reached, "|") != strings.Join(want, "|") {
		t.Errorf("the server saw %q, want %q", reached, want)
	}
}
