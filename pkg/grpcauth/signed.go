package grpcauth

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// Lifetimes and limits of signed credentials (see the package doc).
const (
	// CallLifetime is how long a credential the coordinator signs for one
	// of its own calls stays valid: it is signed as the call starts.
	CallLifetime = 30 * time.Second
	// PushLifetime is how long a KV-push credential stays valid: the
	// coordinator signs it into the Prefill (or Resend) request, and the
	// prefill worker presents it when the prompt's first KV is ready, after
	// its queue.
	PushLifetime = 5 * time.Minute
	// ClockSkew is the difference between the coordinator's and a worker's
	// clocks a credential tolerates.
	ClockSkew = 30 * time.Second
	// maxSeen bounds the credentials a worker remembers against replay;
	// beyond it new credentials are refused until old ones expire.
	maxSeen = 1 << 20
)

// credHeader is the metadata key of a signed credential. It differs from
// the token's (authorization), so that both may travel during a
// migration.
const credHeader = "pdserve-credential"

// credPrefix starts every signed credential: "pdsv1.<claims>.<signature>",
// both parts unpadded base64url.
const credPrefix = "pdsv1."

// PushMethod is the one method a KV-push credential is signed for.
var PushMethod = "/" + pdservev1.KVTransferService_ServiceDesc.ServiceName + "/Push"

// PullMethod is the one method a peer-pull credential is signed for.
var PullMethod = "/" + pdservev1.KVTransferService_ServiceDesc.ServiceName + "/Pull"

// PullSequenceMethod is the one method a migration-pull credential is
// signed for.
var PullSequenceMethod = "/" + pdservev1.KVTransferService_ServiceDesc.ServiceName + "/PullSequence"

// Claims are what a signed credential grants: one call of Method on the
// worker Audience, by Subject, until Expiry. Nonce makes each credential
// unique; a worker accepts it once.
type Claims struct {
	// Audience is the id of the worker the call goes to (its heartbeat id).
	Audience string `json:"aud"`
	// Method is the full gRPC method ("/pdserve.v1.DecodeService/Reserve").
	Method string `json:"mth"`
	// Subject is who presents it: "coordinator", or the id of the prefill
	// worker the coordinator chose to push KV.
	Subject string `json:"sub"`
	// ExpiryMs is the expiry, Unix milliseconds of the signer's clock.
	ExpiryMs int64 `json:"exp"`
	// Nonce is 16 random bytes, hex.
	Nonce string `json:"n"`
	// Epoch, when set, is the audience's boot epoch (its heartbeat's
	// boot_epoch): the worker refuses it after a restart, so that "once"
	// holds across restarts. A pull credential always has one.
	Epoch string `json:"ep,omitempty"`
	// Chain, for a pull credential, is ChainDigest of the exact block
	// hashes the puller may ask for: the holder serves that chain and no
	// other prefix.
	Chain string `json:"chn,omitempty"`
}

// ChainDigest returns the digest a pull credential names of a prompt's
// block hashes: SHA-256 of each as 8 bytes little-endian, in order, hex.
func ChainDigest(hashes []uint64) string {
	h := sha256.New()
	var b [8]byte
	for _, x := range hashes {
		binary.LittleEndian.PutUint64(b[:], x)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SequenceDigest is what a migration-pull credential names in place of a
// chain: the moved request's id, so that it reads that sequence only.
func SequenceDigest(requestID string) string {
	h := sha256.Sum256([]byte("sequence\x00" + requestID))
	return hex.EncodeToString(h[:])
}

// NewEpoch returns a new boot epoch: 16 random hex digits.
func NewEpoch() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// Errors of Verifier.Verify, wrapped; match with errors.Is.
var (
	// ErrBadCredential: not a signed credential, or its signature is not
	// the coordinator's key's.
	ErrBadCredential = errors.New("grpcauth: not a valid signed credential")
	// ErrWrongAudience: signed for another worker.
	ErrWrongAudience = errors.New("grpcauth: credential signed for another worker")
	// ErrWrongMethod: signed for another method.
	ErrWrongMethod = errors.New("grpcauth: credential signed for another method")
	// ErrExpired: past its expiry, or valid for longer than any credential is.
	ErrExpired = errors.New("grpcauth: credential expired")
	// ErrReplayed: presented before.
	ErrReplayed = errors.New("grpcauth: credential already used")
	// ErrWrongEpoch: signed for an earlier start of the worker (or, for
	// a pull, for no start at all).
	ErrWrongEpoch = errors.New("grpcauth: credential signed for another start of this worker")
	// ErrWrongChain: a pull of hashes other than the chain the
	// credential names, or a pull credential naming none.
	ErrWrongChain = errors.New("grpcauth: pull of a prefix the credential does not name")
)

// Signer signs credentials with the coordinator's Ed25519 private key.
// Safe for concurrent use.
type Signer struct {
	key ed25519.PrivateKey
	now func() time.Time
}

// NewSigner returns a Signer of key; now nil is time.Now.
func NewSigner(key ed25519.PrivateKey, now func() time.Time) *Signer {
	if now == nil {
		now = time.Now
	}
	return &Signer{key: key, now: now}
}

// Sign returns a credential for one call of method on the worker aud by
// sub, valid for lifetime from now.
func (s *Signer) Sign(aud, method, sub string, lifetime time.Duration) string {
	return s.SignClaims(Claims{Audience: aud, Method: method, Subject: sub}, lifetime)
}

// SignClaims returns a credential of c (its Audience, Method, Subject,
// Epoch and Chain) with a new nonce, valid for lifetime from now.
func (s *Signer) SignClaims(c Claims, lifetime time.Duration) string {
	n := make([]byte, 16)
	_, _ = rand.Read(n) // crypto/rand.Read never fails
	c.ExpiryMs, c.Nonce = s.now().Add(lifetime).UnixMilli(), hex.EncodeToString(n)
	body, _ := json.Marshal(c) // plain strings and an int: never fails
	payload := credPrefix + base64.RawURLEncoding.EncodeToString(body)
	sig := ed25519.Sign(s.key, []byte(payload))
	return payload + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// Verifier checks signed credentials with the coordinator's public key
// for one worker (self, its id). It remembers every credential it
// accepted until it expires, and accepts none twice. Safe for concurrent
// use.
type Verifier struct {
	pub   ed25519.PublicKey
	self  string
	epoch string // this start's boot epoch; "" refuses every credential bound to one
	now   func() time.Time

	mu   sync.Mutex
	seen map[string]time.Time // nonce → when it may be forgotten
	next time.Time            // when seen is swept next
}

// NewVerifier returns a Verifier of pub for the worker self; now nil is
// time.Now.
func NewVerifier(pub ed25519.PublicKey, self string, now func() time.Time) *Verifier {
	return NewVerifierAt(pub, self, "", now)
}

// NewVerifierAt is NewVerifier for the start epoch of the worker (its
// heartbeat's boot_epoch): it refuses credentials bound to another
// epoch, so that one used before a restart is not accepted after it.
func NewVerifierAt(pub ed25519.PublicKey, self, epoch string, now func() time.Time) *Verifier {
	if now == nil {
		now = time.Now
	}
	return &Verifier{pub: pub, self: self, epoch: epoch, now: now, seen: make(map[string]time.Time)}
}

// Verify checks cred for a call of method and returns its claims. A
// credential bound to an epoch must name this start's; a pull
// credential must be bound to one and name a chain (which the Pull
// handler checks, CheckPull). Errors: ErrBadCredential, ErrWrongAudience,
// ErrWrongMethod, ErrWrongEpoch, ErrWrongChain, ErrExpired, ErrReplayed,
// wrapped (the text names no secret).
func (v *Verifier) Verify(cred, method string) (Claims, error) {
	var c Claims
	if len(cred) > maxTokenBytes || !strings.HasPrefix(cred, credPrefix) {
		return c, ErrBadCredential
	}
	dot := strings.LastIndexByte(cred, '.')
	payload, sigText := cred[:dot], cred[dot+1:]
	sig, err := base64.RawURLEncoding.DecodeString(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(v.pub, []byte(payload), sig) {
		return c, ErrBadCredential
	}
	body, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(payload, credPrefix))
	if err != nil {
		return c, ErrBadCredential
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.Nonce == "" {
		return c, ErrBadCredential
	}
	now := v.now()
	exp := time.UnixMilli(c.ExpiryMs)
	switch {
	case v.self == "" || c.Audience != v.self:
		return c, fmt.Errorf("%w (signed for %q)", ErrWrongAudience, c.Audience)
	case c.Method != method:
		return c, fmt.Errorf("%w (signed for %s)", ErrWrongMethod, c.Method)
	case !now.Before(exp.Add(ClockSkew)):
		return c, fmt.Errorf("%w at %s", ErrExpired, exp.UTC().Format(time.RFC3339))
	case exp.After(now.Add(PushLifetime + ClockSkew)):
		return c, fmt.Errorf("%w: valid until %s, longer than any credential", ErrExpired, exp.UTC().Format(time.RFC3339))
	case (c.Epoch != "" || method == PullMethod || method == PullSequenceMethod) && c.Epoch != v.epoch:
		return c, ErrWrongEpoch
	case (method == PullMethod || method == PullSequenceMethod) && c.Chain == "":
		return c, fmt.Errorf("%w: it names no chain", ErrWrongChain)
	}
	return c, v.once(c.Nonce, exp.Add(ClockSkew), now)
}

// once records nonce until forget, refusing one seen before.
func (v *Verifier) once(nonce string, forget, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if now.After(v.next) || len(v.seen) >= maxSeen {
		for n, t := range v.seen {
			if now.After(t) {
				delete(v.seen, n)
			}
		}
		v.next = now.Add(ClockSkew)
	}
	if _, ok := v.seen[nonce]; ok {
		return ErrReplayed
	}
	if len(v.seen) >= maxSeen {
		return fmt.Errorf("%w: %d credentials in use, no room for more", ErrReplayed, maxSeen)
	}
	v.seen[nonce] = forget
	return nil
}

// signedCreds signs a credential for each call on a connection to one
// worker. It does not require transport security: a credential is worth
// one call of one method on that worker.
type signedCreds struct {
	s   *Signer
	aud string
}

var _ credentials.PerRPCCredentials = signedCreds{}

func (c signedCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, ok := credentials.RequestInfoFromContext(ctx)
	if !ok {
		return nil, errors.New("grpcauth: no method to sign a credential for")
	}
	return map[string]string{credHeader: c.s.Sign(c.aud, ri.Method, SubjectCoordinator, CallLifetime)}, nil
}

func (signedCreds) RequireTransportSecurity() bool { return false }

// SubjectCoordinator is the Subject of the coordinator's own calls.
const SubjectCoordinator = "coordinator"

// GenerateKey returns a new Ed25519 key pair as PEM: the private key
// (PKCS #8, "PRIVATE KEY", the coordinator's --grpc-signing-key) and the
// public key (PKIX, "PUBLIC KEY", the workers' --grpc-verify-key), the
// formats of `openssl genpkey -algorithm ed25519` and `openssl pkey
// -pubout`.
func GenerateKey() (private, public []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("grpcauth: generate key: %w", err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, fmt.Errorf("grpcauth: encode private key: %w", err)
	}
	pk, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("grpcauth: encode public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pk}), nil
}

// readKeyPEM reads the one PEM block of a key file. Errors name the flag
// and the file, never the content.
func readKeyPEM(flagName, path string) (*pem.Block, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	if fi.Size() > maxTokenBytes {
		return nil, fmt.Errorf("%s %s: %d bytes, a PEM Ed25519 key has far fewer", flagName, path, fi.Size())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("%s %s: no PEM block (want an Ed25519 key, e.g. from `coordinator keygen`)", flagName, path)
	}
	return b, nil
}

// readSigningKey reads an Ed25519 private key (PKCS #8 PEM).
func readSigningKey(path string) (ed25519.PrivateKey, error) {
	const name = "grpc-signing-key"
	b, err := readKeyPEM(name, path)
	if err != nil {
		return nil, err
	}
	if b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s %s: a %q PEM block, want an Ed25519 \"PRIVATE KEY\" (PKCS #8)", name, path, b.Type)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s %s: a %T, want an Ed25519 key", name, path, k)
	}
	return priv, nil
}

// readVerifyKey reads an Ed25519 public key (PKIX PEM). A private key is
// refused: a worker holding it could sign as the coordinator.
func readVerifyKey(path string) (ed25519.PublicKey, error) {
	const name = "grpc-verify-key"
	b, err := readKeyPEM(name, path)
	if err != nil {
		return nil, err
	}
	if strings.Contains(b.Type, "PRIVATE") {
		return nil, fmt.Errorf("%s %s: holds a private key; give workers only the public key (openssl pkey -pubout, or coordinator keygen's .pub file)", name, path)
	}
	if b.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%s %s: a %q PEM block, want an Ed25519 \"PUBLIC KEY\"", name, path, b.Type)
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s %s: a %T, want an Ed25519 key", name, path, k)
	}
	return pub, nil
}
