package charttest

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
)

// elasticPool is the elastic pool of ci/elastic-values.yaml (it starts
// as decode workers: the decode-worker binary).
var elasticPool = pool{elasticName, "decode-worker", "elastic"}

// TestElasticTLS renders the elastic pool with TLS on (the default, the
// chart's generated certificates), with and without gRPC tokens, and
// checks over real TLS handshakes on loopback, with the certificates,
// flags and token files each pod gets, as its binary loads them: the
// elastic pool's certificate names its own identity; in either role it
// pushes and pulls KV to and from decode, prefill and elastic workers
// and serves them, and the coordinator accepts it as the server of either
// role; it is refused as the coordinator everywhere. A prefill
// certificate is still refused as the coordinator and as a decode
// worker's server, and a decode certificate still pushes nowhere. The
// decode pool pulls a sequence migrated off an elastic worker with tokens
// on too: beside the elastic pool it holds the prefill token itself.
func TestElasticTLS(t *testing.T) {
	for _, tokens := range []bool{false, true} {
		name := "tls only"
		over := "grpc: {tokens: {enabled: false}}"
		if tokens {
			name, over = "tls and tokens", "{}"
		}
		t.Run(name, func(t *testing.T) {
			r := renderOver(t, "elastic", over)
			gen := generatedTLS(t, r)
			serverName := r.value("tls.serverName").(string)
			identity := func(role string) string {
				return role + "." + releaseName + "-pdserve." + namespace + ".pdserve.internal"
			}
			e, ok := gen["elastic"]
			if !ok {
				t.Fatalf("no generated elastic certificate (roles %v)", keys(gen))
			}
			if diff := cmp.Diff([]string{serverName, identity("elastic")}, e.leaf.DNSNames); diff != "" {
				t.Errorf("elastic certificate's DNS names (-want +got):\n%s", diff)
			}
			spec := &r.deployment(t, elasticName).Spec.Template.Spec
			if v := findVolume(spec, "tls"); v == nil || v.Secret == nil || v.Secret.SecretName != tlsSecretName("elastic") {
				t.Errorf("elastic pool's tls volume %+v, want Secret %s", v, tlsSecretName("elastic"))
			}

			// Who a pod's container is, as a client: its certificate, the
			// templates it checks servers with, the token it sends.
			type party struct {
				secret    string
				templates []string
				token     string
			}
			parties := map[string]party{}
			for _, p := range []struct {
				name, secret, tokenFlag string
				pl                      pool
			}{
				{"coordinator", "coordinator", "grpc-token-file", pool{coordinatorName, "coordinator", "coordinator"}},
				{"prefill", "prefill", "grpc-prefill-token-file", pool{prefillName, "prefill-worker", "prefillWorker"}},
				{"decode", "decode", "grpc-prefill-token-file", pool{decodeName, "decode-worker", "decodeWorker"}},
				{"elastic", "elastic", "grpc-prefill-token-file", elasticPool},
			} {
				args := argMap(container(t, &r.deployment(t, p.pl.deployment).Spec.Template.Spec, p.pl.container).Args)
				tmpl, ok := args["tls-worker-identity"]
				if !ok {
					t.Fatalf("%s: no --tls-worker-identity: it would check its peers against %v", p.name, grpcauth.DefaultWorkerIdentities)
				}
				pt := party{secret: p.secret, templates: strings.Split(tmpl, ",")}
				if tokens && p.tokenFlag != "" {
					pt.token = mountedToken(t, r, p.pl, p.tokenFlag)
				}
				parties[p.name] = pt
			}
			servers := map[string]pool{
				"prefill": {prefillName, "prefill-worker", "prefillWorker"},
				"decode":  {decodeName, "decode-worker", "decodeWorker"},
				"elastic": elasticPool,
			}

			// call: client cli, verifying the server as a worker of
			// heartbeat role hbRole, calls method on a worker of pool srv.
			call := func(t *testing.T, cli, srv, hbRole, method string) error {
				t.Helper()
				c := parties[cli]
				client := loadRoleTLS(t, gen[c.secret], serverName, grpcnet.TLSDial)
				server := loadRoleTLS(t, gen[srv], serverName, grpcnet.TLSServe|grpcnet.TLSDial)
				cfg := grpcauth.VerifyWorker(client.ClientConfig(), c.templates, hbRole, "pod-"+srv)
				state, err := handshake(t, server.ServerConfig(), cfg)
				if err != nil {
					return err
				}
				ctx := peer.NewContext(grpcCaller{c.token, nil}.ctx(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, AuthInfo: credentials.TLSInfo{State: state}})
				_, err = workerAuth(t, r, servers[srv]).UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method},
					func(context.Context, any) (any, error) { return nil, nil })
				return err
			}
			push, pull, pullSeq := pdservev1.KVTransferService_Push_FullMethodName, pdservev1.KVTransferService_Pull_FullMethodName, pdservev1.KVTransferService_PullSequence_FullMethodName
			reserve, generate, prefill := pdservev1.DecodeService_Reserve_FullMethodName, pdservev1.DecodeService_Generate_FullMethodName, pdservev1.PrefillService_Prefill_FullMethodName

			for _, tc := range []struct {
				name, cli, srv, hbRole, method string
				want                           grpccodes.Code // OK, or the refusal
				identity                       bool           // refused in the handshake (grpcauth.ErrIdentity)
			}{
				{name: "elastic as prefill pushes to decode", cli: "elastic", srv: "decode", hbRole: "decode", method: push},
				{name: "prefill pushes to elastic as decode", cli: "prefill", srv: "elastic", hbRole: "decode", method: push},
				{name: "elastic pushes to elastic", cli: "elastic", srv: "elastic", hbRole: "decode", method: push},
				{name: "elastic as decode pulls a migrated sequence from decode", cli: "elastic", srv: "decode", hbRole: "decode", method: pullSeq},
				{name: "elastic as decode pulls a migrated sequence from elastic", cli: "elastic", srv: "elastic", hbRole: "decode", method: pullSeq},
				{name: "decode pulls a migrated sequence from elastic", cli: "decode", srv: "elastic", hbRole: "decode", method: pullSeq},
				{name: "elastic pulls a prefix from prefill", cli: "elastic", srv: "prefill", hbRole: "prefill", method: pull},
				{name: "prefill pulls a prefix from elastic as prefill", cli: "prefill", srv: "elastic", hbRole: "prefill", method: pull},
				{name: "coordinator calls elastic as decode", cli: "coordinator", srv: "elastic", hbRole: "decode", method: reserve},
				{name: "coordinator calls elastic as prefill", cli: "coordinator", srv: "elastic", hbRole: "prefill", method: prefill},
				{name: "elastic as the coordinator on decode", cli: "elastic", srv: "decode", hbRole: "decode", method: reserve, want: grpccodes.PermissionDenied},
				{name: "elastic as the coordinator on elastic", cli: "elastic", srv: "elastic", hbRole: "decode", method: generate, want: grpccodes.PermissionDenied},
				{name: "elastic as the coordinator on prefill", cli: "elastic", srv: "prefill", hbRole: "prefill", method: prefill, want: grpccodes.PermissionDenied},
				{name: "prefill as the coordinator on elastic", cli: "prefill", srv: "elastic", hbRole: "decode", method: reserve, want: grpccodes.PermissionDenied},
				{name: "prefill as the coordinator on decode", cli: "prefill", srv: "decode", hbRole: "decode", method: generate, want: grpccodes.PermissionDenied},
				{name: "decode pushes to decode", cli: "decode", srv: "decode", hbRole: "decode", method: push, want: grpccodes.PermissionDenied},
				{name: "the coordinator takes a prefill certificate for decode", cli: "coordinator", srv: "prefill", hbRole: "decode", method: reserve, identity: true},
				{name: "elastic takes a prefill certificate for decode", cli: "elastic", srv: "prefill", hbRole: "decode", method: push, identity: true},
				{name: "prefill takes a prefill certificate for decode", cli: "prefill", srv: "prefill", hbRole: "decode", method: push, identity: true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					err := call(t, tc.cli, tc.srv, tc.hbRole, tc.method)
					switch {
					case tc.identity:
						if !errors.Is(err, grpcauth.ErrIdentity) {
							t.Errorf("error %v, want %v in the handshake", err, grpcauth.ErrIdentity)
						}
					case tc.want == grpccodes.OK:
						if err != nil {
							t.Errorf("refused: %v", err)
						}
					default:
						if status.Code(err) != tc.want {
							t.Errorf("error %v, want %v", err, tc.want)
						}
					}
				})
			}
		})
	}
}

// TestElasticCertManager: with cert-manager the elastic pool gets a
// Certificate of its own, of its identity, for server and client
// authentication, and the decode pool's may authenticate clients too (a
// migration's pull off an elastic worker).
func TestElasticCertManager(t *testing.T) {
	r := renderOver(t, "elastic", "tls: {certManager: {enabled: true, issuerRef: {name: ca}}}")
	usages := map[string][]string{}
	uris := map[string][]string{}
	for _, o := range r.all("Certificate") {
		c := o.obj.(*certificate)
		role := strings.TrimPrefix(o.name, releaseName+"-pdserve-")
		usages[role], uris[role] = c.Spec.Usages, c.Spec.URIs
	}
	want := map[string][]string{
		"coordinator": {"digital signature", "key encipherment", "client auth"},
		"decode":      {"digital signature", "key encipherment", "server auth", "client auth"},
		"elastic":     {"digital signature", "key encipherment", "server auth", "client auth"},
		"prefill":     {"digital signature", "key encipherment", "server auth", "client auth"},
	}
	if diff := cmp.Diff(want, usages); diff != "" {
		t.Errorf("Certificates' usages (-want +got):\n%s", diff)
	}
	id := "spiffe://cluster.local/ns/" + namespace + "/app/" + releaseName + "-pdserve/elastic"
	if diff := cmp.Diff([]string{id}, uris["elastic"]); diff != "" {
		t.Errorf("elastic Certificate's URIs (-want +got):\n%s", diff)
	}
	args := argMap(container(t, &r.deployment(t, decodeName).Spec.Template.Spec, "decode-worker").Args)
	if !strings.Contains(args["tls-allow-prefill"], id) {
		t.Errorf("decode workers' --tls-allow-prefill=%s lacks the elastic identity %s", args["tls-allow-prefill"], id)
	}
}
