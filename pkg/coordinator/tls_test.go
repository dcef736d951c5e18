package coordinator_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/coordinatorrun"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// tlsServerName is the only name in the test certificates: the
// coordinator dials workers at 127.0.0.1 and must verify this name.
const tlsServerName = "pdserve-grpc"

// tlsOptions returns TLS options with a new CA and a certificate it signs.
func tlsOptions(t *testing.T, caName string) grpcnet.TLSOptions {
	ca := tlstest.NewCA(t, caName)
	leaf := ca.Issue(t, tlstest.Leaf{DNSNames: []string{tlsServerName}})
	return grpcnet.TLSOptions{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile, CAFile: ca.CertFile, ServerName: tlsServerName}
}

// Over mutual TLS (coordinator → workers, prefill → decode), outputs equal
// the engine alone, as they do over plaintext (TestOutputsMatchEngine).
func TestOutputsOverMutualTLS(t *testing.T) {
	ref := newReference(t)
	tlsOpts := tlsOptions(t, "pdserve test CA")
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.TLS = tlsOpts }})
	for _, w := range cl.c.Workers() {
		if !strings.HasPrefix(w.Addr(), "127.0.0.1:") {
			t.Fatalf("worker %s at %s: the test needs a loopback IP address the certificate lacks", w.ID(), w.Addr())
		}
	}
	for _, p := range prompts[:3] {
		t.Run(p.name, func(t *testing.T) {
			req := request{Prompt: p.prompt, MaxTokens: 12, IgnoreEOS: true, Stream: true}
			want := ref.generate(t, promptIDs(p.prompt), req.MaxTokens, engine.Sampling{}, true)
			got := complete(context.Background(), t, cl.url, req)
			if diff := cmp.Diff(want, got.Tokens); diff != "" {
				t.Errorf("tokens (-engine alone +served over mutual TLS):\n%s", diff)
			}
			if got.Budget["kv_bytes_raw"].(float64) <= 0 {
				t.Errorf("no KV transfer: %v", got.Budget)
			}
		})
	}
}

// Workers requiring client certificates refuse a coordinator whose
// certificate their CA did not sign: the coordinator's admission check
// fails, so the workers are never admitted, nothing is served (503) and
// the coordinator is not ready.
func TestWorkersRefuseCoordinatorWithoutValidCert(t *testing.T) {
	workersTLS := tlsOptions(t, "pdserve test CA")
	rogue := tlsOptions(t, "rogue CA")
	coordTLS := workersTLS                                              // trusts the workers …
	coordTLS.CertFile, coordTLS.KeyFile = rogue.CertFile, rogue.KeyFile // … with a certificate they do not trust
	cl := startCluster(t, clusterOpts{noWait: true,
		edit:   func(co *coordinator.Options) { co.TLS = coordTLS },
		worker: func(wo *workerrun.Options) { wo.TLS = workersTLS },
	})
	waitFor(t, 10*time.Second, func() error {
		if n := len(cl.c.Membership().All()); n != 2 {
			return fmt.Errorf("%d workers' heartbeats observed, want 2", n)
		}
		return nil
	})
	if err := cl.c.Ready(); err == nil {
		t.Error("Ready with workers that refuse the coordinator's certificate")
	}
	resp := post(context.Background(), t, cl.url+"/v1/completions", request{Prompt: "let me in", MaxTokens: 4})
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("completion with a refused client certificate: status %d (%s), want 503", resp.StatusCode, body)
	}
}

func TestTLSOptions(t *testing.T) {
	good := tlsOptions(t, "pdserve test CA")
	missing := filepath.Join(t.TempDir(), "missing.crt")
	tests := []struct {
		name    string
		edit    func(*coordinator.Options)
		wantErr string
	}{
		{name: "plaintext"},
		{name: "mutual TLS", edit: func(o *coordinator.Options) { o.TLS = good }},
		{name: "CA only: no client certificate", edit: func(o *coordinator.Options) {
			o.TLS = grpcnet.TLSOptions{CAFile: good.CAFile, ServerName: tlsServerName}
		}},
		{name: "standalone mutual TLS", edit: func(o *coordinator.Options) { o.Standalone, o.TLS = true, good }},
		{name: "standalone workers need the certificate", edit: func(o *coordinator.Options) {
			o.Standalone, o.TLS = true, grpcnet.TLSOptions{CAFile: good.CAFile}
		}, wantErr: "tls-cert and tls-key are required"},
		{name: "CA required to verify workers", edit: func(o *coordinator.Options) {
			o.TLS = grpcnet.TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile}
		}, wantErr: "tls-ca is required"},
		{name: "cert without key", edit: func(o *coordinator.Options) { o.TLS, o.TLS.KeyFile = good, "" },
			wantErr: "tls-cert and tls-key must be given together"},
		{name: "missing CA file", edit: func(o *coordinator.Options) { o.TLS, o.TLS.CAFile = good, missing },
			wantErr: "tls-ca: open " + missing},
		{name: "CA file is a key", edit: func(o *coordinator.Options) { o.TLS, o.TLS.CAFile = good, good.KeyFile },
			wantErr: "want only CERTIFICATE blocks"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := coordinator.DefaultOptions()
			if tc.edit != nil {
				tc.edit(&o)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate error %v, want one about %q", err, tc.wantErr)
			}
		})
	}
	// The same through the command line: exit code 2 and the reason.
	var out strings.Builder
	if code := coordinatorrun.Main(context.Background(), []string{"--tls-cert=" + good.CertFile}, &out, &out); code != 2 ||
		!strings.Contains(out.String(), "tls-cert and tls-key must be given together") {
		t.Errorf("--tls-cert alone: exit %d, output %q", code, out.String())
	}
}
