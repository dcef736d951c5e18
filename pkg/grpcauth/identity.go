package grpcauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// DefaultWorkerIdentities are the identities a worker's certificate must
// carry by default (--tls-worker-identity): a URI SAN naming its role,
// and optionally its id.
var DefaultWorkerIdentities = []string{"spiffe://pdserve/{role}", "spiffe://pdserve/{role}/{id}"}

// ErrIdentity: a peer's verified certificate does not name the role (and
// id) its heartbeat claims.
var ErrIdentity = errors.New("grpcauth: certificate does not name the worker")

// workerRoles are the roles a role-bound template may name.
var workerRoles = []string{"prefill", "decode", "colocated"}

// roleBound splits a role-bound template "ROLE=IDENTITY"; ok false for a
// generic one.
func roleBound(t string) (role, id string, ok bool) {
	role, id, ok = strings.Cut(t, "=")
	if !ok || strings.ContainsAny(role, ":/{") {
		return "", t, false
	}
	return role, id, true
}

// CheckIdentityTemplates checks worker identity templates: each a URI
// ("scheme://…") or DNS name holding {role} and optionally {id}, or
// "ROLE=IDENTITY", an identity (optionally with {id}) for the workers of
// one role (prefill, decode or colocated).
func CheckIdentityTemplates(ts []string) error {
	var errs []error
	for _, t := range ts {
		id := t
		if role, v, ok := roleBound(t); ok {
			if !slices.Contains(workerRoles, role) {
				errs = append(errs, fmt.Errorf("tls-worker-identity %q: role %q is not one of %s", t, role, strings.Join(workerRoles, ", ")))
				continue
			}
			id = v
		} else if !strings.Contains(t, "{role}") {
			errs = append(errs, fmt.Errorf("tls-worker-identity %q: needs {role}, or ROLE= before it", t))
			continue
		}
		if err := checkIdentity(strings.NewReplacer("{role}", "r", "{id}", "i").Replace(id)); err != nil {
			errs = append(errs, fmt.Errorf("tls-worker-identity %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// WorkerIdentity returns the name of leaf that one of templates gives for
// the worker role and id ({role} and {id} replaced; a role-bound template
// "ROLE=IDENTITY" only for its role; URIs compared exactly, DNS names
// case-insensitively), or ErrIdentity, wrapped with the certificate's
// names. Empty templates accept any certificate.
func WorkerIdentity(leaf *x509.Certificate, templates []string, role, id string) (string, error) {
	if len(templates) == 0 {
		return certIdentity(leaf, nil), nil
	}
	if leaf == nil {
		return "", fmt.Errorf("%w: no certificate", ErrIdentity)
	}
	r := strings.NewReplacer("{role}", role, "{id}", id)
	var want []string
	for _, t := range templates {
		if rb, v, ok := roleBound(t); ok {
			if rb != role {
				continue
			}
			t = v
		}
		want = append(want, r.Replace(t))
	}
	if len(want) == 0 {
		return "", fmt.Errorf("%w %s %s: no identity is configured for role %s", ErrIdentity, role, id, role)
	}
	if name := certIdentity(leaf, want); name != "" {
		return name, nil
	}
	return "", fmt.Errorf("%w %s %s: it names %s, want one of %s", ErrIdentity, role, id, certNames(leaf), strings.Join(want, ", "))
}

// VerifyWorker returns a copy of cfg (a gRPC client's TLS configuration,
// which verifies the chain) that also refuses, in the handshake, a server
// whose certificate does not name the worker role and id (WorkerIdentity
// with templates). So nothing, no credential and no request, is sent to a
// peer before its identity is proven. A nil cfg stays nil (plaintext).
func VerifyWorker(cfg *tls.Config, templates []string, role, id string) *tls.Config {
	if cfg == nil {
		return nil
	}
	cfg = cfg.Clone()
	inner := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if inner != nil {
			if err := inner(cs); err != nil {
				return err
			}
		}
		var leaf *x509.Certificate
		if len(cs.PeerCertificates) > 0 {
			leaf = cs.PeerCertificates[0]
		}
		_, err := WorkerIdentity(leaf, templates, role, id)
		return err
	}
	return cfg
}
