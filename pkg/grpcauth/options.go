package grpcauth

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.uber.org/zap"
)

// MinTokenBytes is the shortest token a token file may hold: 16 bytes is
// too short to guess, and any generated secret is longer (the chart's are
// 32 random bytes, hex or base64).
const MinTokenBytes = 16

// maxTokenBytes bounds a token, on disk and in metadata: longer ones are
// refused unread.
const maxTokenBytes = 4096

// hashPrefix marks a token file that holds a token's SHA-256 digest.
const hashPrefix = "sha256:"

// Options configure who may call a component's gRPC server and what it
// presents when it calls others. The zero value configures nothing: no
// token, no identity check.
type Options struct {
	// TokenFile holds the coordinator's token (--grpc-token-file): sent by
	// the coordinator, required by workers for the coordinator's methods,
	// and for KV pushes too when PrefillTokenFile is empty.
	TokenFile string
	// PrefillTokenFile holds the prefill workers' token
	// (--grpc-prefill-token-file): sent by prefill workers on KV pushes,
	// required by decode workers for them. Needs TokenFile. Workers only.
	PrefillTokenFile string
	// AllowCoordinator and AllowPrefill are the identities allowed in
	// each role with mutual TLS (--tls-allow-coordinator,
	// --tls-allow-prefill; repeatable, comma-separated): DNS names or URIs
	// among a certificate's subject alternative names. Empty: any
	// certificate the CA signed. Workers only.
	AllowCoordinator []string
	AllowPrefill     []string

	// SigningKeyFile holds the coordinator's Ed25519 private key
	// (--grpc-signing-key, PKCS #8 PEM): it signs a credential for each of
	// its calls, bound to the worker, the method and a short expiry, and a
	// KV-push credential per request for the prefill worker. Coordinator
	// only.
	SigningKeyFile string
	// VerifyKeyFile holds the public key of SigningKeyFile
	// (--grpc-verify-key, PKIX PEM): a worker given it accepts the
	// coordinator's signed credentials for its own id (Self). Workers
	// only.
	VerifyKeyFile string
	// WorkerIdentities are the identity templates a worker's verified
	// certificate must match before anything is sent to it
	// (--tls-worker-identity; see WorkerIdentity): the coordinator checks
	// every worker, a prefill worker its decode peers. Used with TLS only.
	// Nil: DefaultWorkerIdentities; empty but not nil: any certificate the
	// CA signed.
	WorkerIdentities []string

	// Self is the worker's own id, the audience of the credentials it
	// accepts. Not a flag: workerrun sets it.
	Self string
	// Epoch is the worker's boot epoch (NewEpoch, in its heartbeats):
	// credentials bound to another are refused, pull credentials without
	// one too. Not a flag: set in code.
	Epoch string

	// Token and PrefillToken, when not empty, are the tokens themselves,
	// used instead of the files: components started in one process
	// (standalone) share tokens generated at start. SigningKey and
	// VerifyKey are the keys in memory in the same way. Not flags; never
	// logged.
	Token, PrefillToken string
	SigningKey          ed25519.PrivateKey
	VerifyKey           ed25519.PublicKey
}

// AddFlags registers --grpc-token-file on fs and, when serve is set (a
// worker), --grpc-prefill-token-file, --tls-allow-coordinator and
// --tls-allow-prefill, with o's values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet, serve bool) {
	fs.StringVar(&o.TokenFile, "grpc-token-file", o.TokenFile, "file holding the coordinator's gRPC token (a Secret): the coordinator sends it, workers require it (also for KV pushes without --grpc-prefill-token-file); a worker's file may hold sha256:<hex> instead (empty: no token). A static token is sent only over TLS to verified workers; prefer --grpc-signing-key")
	if !serve {
		fs.StringVar(&o.SigningKeyFile, "grpc-signing-key", o.SigningKeyFile, "PEM Ed25519 private key (a Secret; coordinator keygen, or openssl genpkey -algorithm ed25519) that signs a credential for each gRPC call, bound to the worker, the method and a short expiry; workers get the public key (--grpc-verify-key)")
		o.AddWorkerIdentityFlag(fs)
		return
	}
	fs.StringVar(&o.VerifyKeyFile, "grpc-verify-key", o.VerifyKeyFile, "PEM Ed25519 public key of the coordinator's --grpc-signing-key: the worker then accepts the coordinator's signed per-call credentials, for its own --id only")
	fs.StringVar(&o.PrefillTokenFile, "grpc-prefill-token-file", o.PrefillTokenFile, "file holding the prefill workers' gRPC token: prefill workers send it on KV pushes, decode workers require it for them (a decode worker given the token itself, not sha256:<hex>, sends it on its KV pulls); needs --grpc-token-file (empty: KV pushes use --grpc-token-file's token)")
	fs.Var((*listFlag)(&o.AllowCoordinator), "tls-allow-coordinator", "with mutual TLS, a DNS name or URI (e.g. spiffe://…/coordinator) a certificate must name to call DecodeService and PrefillService; repeatable, comma-separated (default: any certificate the CA signed)")
	fs.Var((*listFlag)(&o.AllowPrefill), "tls-allow-prefill", "with mutual TLS, a DNS name or URI a certificate must name to push KV to a decode worker; repeatable, comma-separated (default: any certificate the CA signed)")
}

// AddWorkerIdentityFlag registers --tls-worker-identity on fs: the
// coordinator's check of every worker, a prefill worker's of its decode
// peers.
func (o *Options) AddWorkerIdentityFlag(fs *flag.FlagSet) {
	fs.Var(&identityFlag{l: &o.WorkerIdentities}, "tls-worker-identity", "with TLS, a URI or DNS name with {role} and optionally {id} (or ROLE=IDENTITY for one role) that a worker's certificate must name for the role and id its heartbeat claims before any call to it; repeatable, comma-separated; set to '' to accept any certificate the CA signed (default "+strings.Join(DefaultWorkerIdentities, ",")+")")
}

// identityFlag is a listFlag whose first Set replaces the default; an
// empty value leaves an empty, non-nil list: any certificate.
type identityFlag struct {
	l   *[]string
	set bool
}

func (f *identityFlag) String() string {
	if f == nil || f.l == nil {
		return ""
	}
	return strings.Join(*f.l, ",")
}

func (f *identityFlag) Set(s string) error {
	if !f.set {
		*f.l, f.set = []string{}, true
	}
	return (*listFlag)(f.l).Set(s)
}

// listFlag is a repeatable flag of comma-separated values.
type listFlag []string

func (l *listFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *listFlag) Set(s string) error {
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// Tokens reports whether a token is configured.
func (o Options) Tokens() bool { return o.TokenFile != "" || o.Token != "" }

// Identities reports whether a role has allowed certificate identities.
func (o Options) Identities() bool { return len(o.AllowCoordinator)+len(o.AllowPrefill) > 0 }

// Signs reports whether the coordinator signs per-call credentials.
func (o Options) Signs() bool { return o.SigningKeyFile != "" || o.SigningKey != nil }

// PublicKey returns the public key of the signing key (SigningKey, else
// the file's), for workers started in the same process. Errors: the
// file's, as Validate.
func (o Options) PublicKey() (ed25519.PublicKey, error) {
	k := o.SigningKey
	if k == nil {
		var err error
		if k, err = readSigningKey(o.SigningKeyFile); err != nil {
			return nil, fmt.Errorf("grpcauth: %w", err)
		}
	}
	return k.Public().(ed25519.PublicKey), nil
}

// Verifies reports whether a worker accepts signed credentials.
func (o Options) Verifies() bool { return o.VerifyKeyFile != "" || o.VerifyKey != nil }

// Validate checks the settings for a component that sends the token of
// role present (RoleCoordinator: the coordinator; RolePrefill: a prefill
// worker; 0: a decode worker, which sends the prefill token on its KV
// pulls when its --grpc-prefill-token-file holds the token itself, and no
// token otherwise), reading the token files.
// It reports every problem in one error. It does not check that mutual TLS
// is on for the allowed identities: the caller knows (see workerrun).
func (o Options) Validate(present Role) error {
	_, err := o.load(present)
	return err
}

// LogFields returns the settings as zap fields: file names and
// identities, never a token.
func (o Options) LogFields() []zap.Field {
	return []zap.Field{
		zap.String("grpc_token_file", o.TokenFile), zap.String("grpc_prefill_token_file", o.PrefillTokenFile),
		zap.Bool("grpc_token_in_memory", o.Token != ""),
		zap.String("grpc_signing_key", o.SigningKeyFile), zap.String("grpc_verify_key", o.VerifyKeyFile),
		zap.Bool("grpc_keys_in_memory", o.SigningKey != nil || o.VerifyKey != nil),
		zap.Strings("tls_worker_identity", o.WorkerIdentities),
		zap.Strings("tls_allow_coordinator", o.AllowCoordinator), zap.Strings("tls_allow_prefill", o.AllowPrefill),
	}
}

// secret is one role's token as a worker checks it and, when the file
// held the token itself, as a client sends it.
type secret struct {
	digest [sha256.Size]byte
	token  string // empty when only the digest is known
}

// load reads and checks everything Load needs.
func (o Options) load(present Role) (*Auth, error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	a := &Auth{allow: map[Role][]string{}}
	if o.Tokens() {
		c, err := readSecret("grpc-token-file", o.TokenFile, o.Token)
		if err != nil {
			errs = append(errs, err)
		}
		a.coord = c
		a.prefill = c // one shared token unless a prefill token is given
		if o.PrefillTokenFile != "" || o.PrefillToken != "" {
			p, err := readSecret("grpc-prefill-token-file", o.PrefillTokenFile, o.PrefillToken)
			if err != nil {
				errs = append(errs, err)
			}
			a.prefill = p
		}
	} else if o.PrefillTokenFile != "" || o.PrefillToken != "" {
		bad("grpc-prefill-token-file %q needs grpc-token-file: the coordinator's methods would be open", o.PrefillTokenFile)
	}
	if errs == nil {
		switch present {
		case RoleCoordinator:
			if a.coord != nil && a.coord.token == "" {
				bad("grpc-token-file %s holds a digest (%s…), but the coordinator sends the token: give it the token itself", o.TokenFile, hashPrefix)
			}
			if a.coord != nil {
				a.send = a.coord.token
			}
		case RolePrefill:
			if a.prefill != nil && a.prefill.token == "" {
				name, file := "grpc-prefill-token-file", o.PrefillTokenFile
				if a.prefill == a.coord {
					name, file = "grpc-token-file", o.TokenFile
				}
				bad("%s %s holds a digest (%s…), but a prefill worker sends the token on KV pushes: give it the token itself", name, file, hashPrefix)
			}
			if a.prefill != nil {
				a.send = a.prefill.token
			}
		default:
			// A decode worker given the prefill token itself, not only
			// its digest (the chart's decode pool beside an elastic
			// one), sends it on its KV pulls: a migrated sequence's off
			// an elastic worker, a prefix off a peer. Never the
			// coordinator's token: a shared one stays unsent.
			if a.prefill != nil && a.prefill != a.coord {
				a.send = a.prefill.token
			}
		}
	}
	switch {
	case o.SigningKey != nil:
		a.signer = NewSigner(o.SigningKey, nil)
	case o.SigningKeyFile != "":
		k, err := readSigningKey(o.SigningKeyFile)
		if err != nil {
			errs = append(errs, err)
		} else {
			a.signer = NewSigner(k, nil)
		}
	}
	if a.signer != nil && present != RoleCoordinator {
		bad("grpc-signing-key is the coordinator's: a worker holding it could sign as the coordinator; give workers --grpc-verify-key")
	}
	var pub ed25519.PublicKey
	switch {
	case o.VerifyKey != nil:
		pub = o.VerifyKey
	case o.VerifyKeyFile != "":
		k, err := readVerifyKey(o.VerifyKeyFile)
		if err != nil {
			errs = append(errs, err)
		}
		pub = k
	}
	if pub != nil {
		a.verifier = NewVerifierAt(pub, o.Self, o.Epoch, nil)
	}
	a.workerIDs = o.WorkerIdentities
	if a.workerIDs == nil {
		a.workerIDs = DefaultWorkerIdentities
	}
	if err := CheckIdentityTemplates(a.workerIDs); err != nil {
		errs = append(errs, err)
	}
	for role, ids := range map[Role][]string{RoleCoordinator: o.AllowCoordinator, RolePrefill: o.AllowPrefill} {
		for _, id := range ids {
			if err := checkIdentity(id); err != nil {
				bad("tls-allow-%s %q: %v", role, id, err)
				continue
			}
			a.allow[role] = append(a.allow[role], id)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("grpcauth: %w", err)
	}
	return a, nil
}

// readSecret reads a token file (or takes the in-memory token). Errors
// name the flag and the file, never its content.
func readSecret(flagName, path, inMemory string) (*secret, error) {
	text := inMemory
	if text == "" {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		if fi.Size() > maxTokenBytes {
			return nil, fmt.Errorf("%s %s: %d bytes, a token has at most %d", flagName, path, fi.Size(), maxTokenBytes)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		text = string(data)
	}
	text = strings.TrimSpace(text)
	if h, ok := strings.CutPrefix(text, hashPrefix); ok {
		d, err := hex.DecodeString(h)
		if err != nil || len(d) != sha256.Size {
			return nil, fmt.Errorf("%s %s: after %q want %d hex digits (a SHA-256 digest)", flagName, path, hashPrefix, 2*sha256.Size)
		}
		s := &secret{}
		copy(s.digest[:], d)
		return s, nil
	}
	switch {
	case len(text) < MinTokenBytes:
		return nil, fmt.Errorf("%s %s: the token has %d bytes, want at least %d (e.g. 32 random bytes, hex)", flagName, path, len(text), MinTokenBytes)
	case len(text) > maxTokenBytes:
		return nil, fmt.Errorf("%s %s: the token has %d bytes, at most %d", flagName, path, len(text), maxTokenBytes)
	case strings.ContainsFunc(text, func(r rune) bool { return r < 0x21 || r > 0x7e }):
		// gRPC metadata values must be printable ASCII.
		return nil, fmt.Errorf("%s %s: the token must be printable ASCII without spaces", flagName, path)
	}
	return &secret{digest: sha256.Sum256([]byte(text)), token: text}, nil
}

// checkIdentity accepts a URI with a scheme and an opaque or host part, or
// a DNS name.
func checkIdentity(id string) error {
	if strings.Contains(id, "://") {
		u, err := url.Parse(id)
		if err != nil {
			return err
		}
		if u.Scheme == "" || u.Host == "" && u.Opaque == "" && u.Path == "" {
			return errors.New("a URI needs a scheme and a host or path")
		}
		return nil
	}
	if strings.ContainsAny(id, " /:@") {
		return errors.New("want a DNS name or a URI (scheme://…)")
	}
	return nil
}
