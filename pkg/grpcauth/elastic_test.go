package grpcauth

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// TestElasticIdentity: an elastic worker pool with an identity of its own
// (as the chart configures it with TLS), over real mutual TLS on
// loopback. Workers allow it on KV transfer beside the prefill identity
// (--tls-allow-prefill), an elastic worker also the decode identity (a
// migration's pull off it), and callers verify it as the server of either
// worker role (--tls-worker-identity decode=…, prefill=… for both). So
// it pushes and pulls KV to and from decode and elastic workers in both
// directions, the coordinator calls it in either role, and it is refused
// as the coordinator; a prefill identity is still refused as the
// coordinator and as a decode worker's server, and a decode identity
// still pushes to no decode worker.
func TestElasticIdentity(t *testing.T) {
	const serverName = "pdserve-grpc"
	ids := map[string]string{}
	ca := tlstest.NewCA(t, "elastic test CA")
	certs := map[string]tlstest.Pair{}
	for _, role := range []string{"coordinator", "prefill", "decode", "elastic"} {
		ids[role] = "spiffe://pdserve-test/" + role
		certs[role] = ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}, URIs: []*url.URL{tlstest.MustURL(t, ids[role])}})
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	templates := []string{"decode=" + ids["decode"], "decode=" + ids["elastic"], "prefill=" + ids["prefill"], "prefill=" + ids["elastic"]}

	// The workers' servers, as the chart's flags configure them.
	servers := map[string]string{}
	for role, allowKV := range map[string][]string{
		"decode":  {ids["prefill"], ids["elastic"]},
		"elastic": {ids["prefill"], ids["elastic"], ids["decode"]},
	} {
		a, err := Options{AllowCoordinator: []string{ids["coordinator"]}, AllowPrefill: allowKV}.Load(0, nil)
		if err != nil {
			t.Fatal(err)
		}
		creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{loadPair(t, certs[role])}, ClientCAs: roots,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
		servers[role], _ = serve(t, a, grpc.Creds(creds))
	}
	// dialAs dials the worker server with client's certificate, verifying
	// it as a worker of hbRole with tmpl.
	dialAs := func(t *testing.T, client, server, hbRole string, tmpl []string) *grpc.ClientConn {
		cfg := &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{loadPair(t, certs[client])}}
		return dialRaw(t, servers[server], grpc.WithTransportCredentials(credentials.NewTLS(VerifyWorker(cfg, tmpl, hbRole, "pod-1"))))
	}
	// pullSeq opens a PullSequence stream; a call admitted gets
	// Unimplemented from the fake worker.
	pullSeq := func(t *testing.T, cc *grpc.ClientConn) codes.Code {
		st, err := pdservev1.NewKVTransferServiceClient(cc).PullSequence(ctxT(t), &pdservev1.PullSequenceRequest{RequestId: "r"})
		if err == nil {
			_, err = st.Recv()
		}
		return status.Code(err)
	}

	admitted := codes.Unimplemented // PullSequence let through to the fake worker
	for _, tc := range []struct {
		name, client, server, hbRole string
		tmpl                         []string
		reserve, push, pull          codes.Code
	}{
		{"elastic (prefill) → decode", "elastic", "decode", "decode", templates, codes.PermissionDenied, codes.OK, admitted},
		{"decode → elastic (decode): a migration's pull", "decode", "elastic", "decode", templates, codes.PermissionDenied, codes.OK, admitted},
		{"elastic → elastic (decode)", "elastic", "elastic", "decode", templates, codes.PermissionDenied, codes.OK, admitted},
		{"elastic → elastic (prefill)", "elastic", "elastic", "prefill", templates, codes.PermissionDenied, codes.OK, admitted},
		{"prefill → elastic (decode)", "prefill", "elastic", "decode", templates, codes.PermissionDenied, codes.OK, admitted},
		{"prefill → decode", "prefill", "decode", "decode", templates, codes.PermissionDenied, codes.OK, admitted},
		{"coordinator → elastic (decode)", "coordinator", "elastic", "decode", templates, codes.OK, codes.PermissionDenied, codes.PermissionDenied},
		{"coordinator → elastic (prefill)", "coordinator", "elastic", "prefill", templates, codes.OK, codes.PermissionDenied, codes.PermissionDenied},
		{"decode → decode", "decode", "decode", "decode", templates, codes.PermissionDenied, codes.PermissionDenied, codes.PermissionDenied},
		// Without the elastic templates, an elastic worker's certificate
		// is no worker's: refused in the handshake.
		{"coordinator → elastic, templates without it", "coordinator", "elastic", "decode", []string{"decode=" + ids["decode"], "prefill=" + ids["prefill"]},
			codes.Unavailable, codes.Unavailable, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := dialAs(t, tc.client, tc.server, tc.hbRole, tc.tmpl)
			r, p, _ := calls(t, cc)
			if q := pullSeq(t, cc); r != tc.reserve || p != tc.push || q != tc.pull {
				t.Errorf("Reserve %v, Push %v, PullSequence %v; want %v, %v, %v", r, p, q, tc.reserve, tc.push, tc.pull)
			}
		})
	}

	// A prefill certificate is no decode worker's, and no coordinator's.
	leaf, err := x509.ParseCertificate(loadPair(t, certs["prefill"]).Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WorkerIdentity(leaf, templates, "decode", "pod-1"); err == nil {
		t.Error("a prefill certificate passes for a decode worker")
	}
	if _, err := WorkerIdentity(leaf, templates, "prefill", "pod-1"); err != nil {
		t.Errorf("a prefill certificate refused as a prefill worker: %v", err)
	}
}
