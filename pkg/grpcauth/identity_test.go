package grpcauth

import (
	"crypto/x509"
	"errors"
	"testing"

	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// A worker's certificate must name the role its heartbeat claims, and
// the id when it names one.
func TestWorkerIdentity(t *testing.T) {
	ca := tlstest.NewCA(t, "identity CA")
	issue := func(uris ...string) *x509.Certificate {
		l := tlstest.Leaf{DNSNames: []string{"pdserve-grpc"}}
		for _, u := range uris {
			l.URIs = append(l.URIs, tlstest.MustURL(t, u))
		}
		return ca.Issue(t, l).Cert
	}
	decodeRole, decode0 := issue("spiffe://pdserve/decode"), issue("spiffe://pdserve/decode/decode-0")
	prefill, shared := issue("spiffe://pdserve/prefill"), issue()
	tests := []struct {
		name      string
		leaf      *x509.Certificate
		templates []string
		role, id  string
		ok        bool
	}{
		{"role certificate", decodeRole, DefaultWorkerIdentities, "decode", "decode-0", true},
		{"role certificate, any id", decodeRole, DefaultWorkerIdentities, "decode", "decode--evil", true},
		{"id certificate", decode0, DefaultWorkerIdentities, "decode", "decode-0", true},
		{"id certificate, another id", decode0, DefaultWorkerIdentities, "decode", "decode--evil", false},
		{"another role", prefill, DefaultWorkerIdentities, "decode", "decode-0", false},
		{"no role", shared, DefaultWorkerIdentities, "decode", "decode-0", false},
		{"no certificate", nil, DefaultWorkerIdentities, "decode", "decode-0", false},
		{"DNS template", shared, []string{"pdserve-grpc"}, "decode", "decode-0", false}, // no {role}: CheckIdentityTemplates refuses it
		{"any certificate", shared, []string{}, "decode", "decode-0", true},
		{"role-bound", decodeRole, []string{"decode=spiffe://pdserve/decode", "prefill=spiffe://pdserve/prefill"}, "decode", "decode-0", true},
		{"role-bound, another role's", prefill, []string{"decode=spiffe://pdserve/decode", "prefill=spiffe://pdserve/prefill"}, "decode", "decode-0", false},
		{"role-bound, none for the role", decodeRole, []string{"prefill=spiffe://pdserve/prefill"}, "decode", "decode-0", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "DNS template" {
				if CheckIdentityTemplates(tc.templates) == nil {
					t.Error("a template without {role} passed CheckIdentityTemplates")
				}
				return
			}
			_, err := WorkerIdentity(tc.leaf, tc.templates, tc.role, tc.id)
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrIdentity) {
				t.Errorf("WorkerIdentity = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
