package workerrun

import (
	"strings"
	"testing"
)

// TestPullsUnverified: a worker pulls peer KV only where it verifies the
// peer: over TLS naming the peers' identities, or among the workers of
// its own process. Plaintext, or TLS taking any certificate of the CA,
// turns pulls off with a reason (issue 38: a fake decode worker's KV was
// pulled over plaintext and served).
func TestPullsUnverified(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*Options)
		tls     bool
		wantSay string // "" pulls allowed
	}{
		{"plaintext", nil, false, "plaintext"},
		{"TLS, default identities", nil, true, ""},
		{"TLS, any certificate", func(o *Options) { o.GRPCAuth.WorkerIdentities = []string{} }, true, "--tls-worker-identity is empty"},
		{"in process", func(o *Options) { o.PeersInProcess = true }, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewPrefillOptions()
			if tc.edit != nil {
				tc.edit(&o)
			}
			got := o.pullsUnverified(tc.tls)
			if (got == "") != (tc.wantSay == "") || !strings.Contains(got, tc.wantSay) {
				t.Errorf("pullsUnverified = %q, want %q", got, tc.wantSay)
			}
		})
	}
}
