package control

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Reconnect backoff defaults: the first retry after DefaultReconnectWait,
// doubling up to reconnectWaitCap (or ReconnectWait when larger), each
// delay with ±20 % jitter.
const (
	DefaultReconnectWait = time.Second
	reconnectWaitCap     = 10 * time.Second
	reconnectJitter      = 0.2
)

// Kinds of NATS client authentication, as ConnOptions.Auth reports them.
const (
	AuthNone  = "none"     // no credentials
	AuthUser  = "user"     // user and password
	AuthToken = "token"    // a token
	AuthNKey  = "nkey"     // an NKey seed: the password never travels, the server's nonce is signed
	AuthCreds = "creds"    // a creds file: user JWT and NKey seed (decentralized auth)
	authMixed = "multiple" // an invalid mix, refused by Validate
)

// ConnOptions are how a pdserve component connects to NATS: at most one
// kind of credentials, TLS, and the reconnect backoff. The zero value
// connects without credentials and without TLS, to a server that allows
// that (StartEmbedded without WithUsers, in tests). Secrets are read from
// files, never taken on the command line; the password and token files
// are re-read at every (re)connect, so a rotated Secret applies without a
// restart. Build with the zero value or AddFlags, then Validate.
type ConnOptions struct {
	// User and PasswordFile: user/password authentication. The file holds
	// the password (surrounding white space trimmed).
	User         string
	PasswordFile string
	// Password is a password given in code (the standalone coordinator's
	// generated credentials for its own workers); used when PasswordFile
	// is empty. Not a flag; never logged.
	Password string
	// TokenFile holds a token (surrounding white space trimmed).
	TokenFile string
	// NKeySeedFile holds an NKey user seed ("SU..."); only the signature of
	// the server's nonce is sent.
	NKeySeedFile string
	// CredsFile is a NATS creds file (user JWT and NKey seed), as nsc
	// writes it, for servers with decentralized (operator/JWT) auth.
	CredsFile string
	// TLSCA is a PEM bundle of the CAs that verify the server; setting it
	// requires TLS. TLSCert and TLSKey (both or neither) are the client
	// certificate for servers that verify clients.
	TLSCA, TLSCert, TLSKey string
	// ReconnectWait is the first delay between connection attempts; it
	// doubles up to 10 s (or ReconnectWait when larger), with ±20 %
	// jitter. 0: DefaultReconnectWait.
	ReconnectWait time.Duration
}

// AddFlags registers --nats-user, --nats-password-file, --nats-token-file,
// --nats-nkey-seed-file, --nats-creds, --nats-tls-ca, --nats-tls-cert,
// --nats-tls-key and --nats-reconnect-wait on fs, with o's values as
// defaults. --nats-url stays with each binary (its meaning differs).
func (o *ConnOptions) AddFlags(fs *flag.FlagSet) {
	if o.ReconnectWait == 0 {
		o.ReconnectWait = DefaultReconnectWait
	}
	fs.StringVar(&o.User, "nats-user", o.User, "NATS user name; with --nats-password-file")
	fs.StringVar(&o.PasswordFile, "nats-password-file", o.PasswordFile, "file holding the NATS user's password (re-read at each reconnect)")
	fs.StringVar(&o.TokenFile, "nats-token-file", o.TokenFile, "file holding a NATS authentication token (re-read at each reconnect)")
	fs.StringVar(&o.NKeySeedFile, "nats-nkey-seed-file", o.NKeySeedFile, "file holding a NATS NKey user seed (SU...)")
	fs.StringVar(&o.CredsFile, "nats-creds", o.CredsFile, "NATS creds file (user JWT and NKey seed) for decentralized auth")
	fs.StringVar(&o.TLSCA, "nats-tls-ca", o.TLSCA, "PEM file of the CAs that verify the NATS server (requires TLS)")
	fs.StringVar(&o.TLSCert, "nats-tls-cert", o.TLSCert, "PEM client certificate presented to the NATS server; with --nats-tls-key")
	fs.StringVar(&o.TLSKey, "nats-tls-key", o.TLSKey, "PEM private key of --nats-tls-cert")
	fs.DurationVar(&o.ReconnectWait, "nats-reconnect-wait", o.ReconnectWait, "first delay between NATS connection attempts; doubles up to 10s, with jitter (connections are retried forever)")
}

// Auth returns the kind of credentials o carries: AuthNone, AuthUser,
// AuthToken, AuthNKey or AuthCreds ("multiple" when Validate would refuse
// the mix).
func (o ConnOptions) Auth() string {
	var kinds []string
	if o.User != "" || o.PasswordFile != "" || o.Password != "" {
		kinds = append(kinds, AuthUser)
	}
	if o.TokenFile != "" {
		kinds = append(kinds, AuthToken)
	}
	if o.NKeySeedFile != "" {
		kinds = append(kinds, AuthNKey)
	}
	if o.CredsFile != "" {
		kinds = append(kinds, AuthCreds)
	}
	switch len(kinds) {
	case 0:
		return AuthNone
	case 1:
		return kinds[0]
	}
	return authMixed
}

// Given reports whether any credential or TLS setting is given (the
// reconnect wait aside).
func (o ConnOptions) Given() bool {
	return o.Auth() != AuthNone || o.TLSCA != "" || o.TLSCert != "" || o.TLSKey != ""
}

// Validate reports every inconsistent setting in one error: more than one
// kind of credentials, a user without a password or the reverse, a
// certificate without its key or the reverse, a negative reconnect wait.
// It reads no file (NATSOptions does).
func (o ConnOptions) Validate() error {
	var errs []error
	if o.Auth() == authMixed {
		errs = append(errs, errors.New("nats: give one of --nats-user with --nats-password-file, --nats-token-file, --nats-nkey-seed-file or --nats-creds"))
	}
	if o.User != "" && o.PasswordFile == "" && o.Password == "" {
		errs = append(errs, errors.New("nats: --nats-user needs --nats-password-file"))
	}
	if o.User == "" && (o.PasswordFile != "" || o.Password != "") {
		errs = append(errs, errors.New("nats: --nats-password-file needs --nats-user"))
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("nats: --nats-tls-cert and --nats-tls-key go together"))
	}
	if o.ReconnectWait < 0 {
		errs = append(errs, fmt.Errorf("nats: --nats-reconnect-wait %v must not be negative", o.ReconnectWait))
	}
	return errors.Join(errs...)
}

// LogFields returns the settings as zap fields: the kind of credentials,
// the user name and file paths, never a password, token or seed.
func (o ConnOptions) LogFields() []zap.Field {
	return []zap.Field{
		zap.String("nats_auth", o.Auth()),
		zap.String("nats_user", o.User),
		zap.String("nats_password_file", o.PasswordFile),
		zap.String("nats_token_file", o.TokenFile),
		zap.String("nats_nkey_seed_file", o.NKeySeedFile),
		zap.String("nats_creds", o.CredsFile),
		zap.String("nats_tls_ca", o.TLSCA),
		zap.String("nats_tls_cert", o.TLSCert),
		zap.String("nats_tls_key", o.TLSKey),
		zap.Duration("nats_reconnect_wait", o.reconnectWait()),
	}
}

func (o ConnOptions) reconnectWait() time.Duration {
	if o.ReconnectWait <= 0 {
		return DefaultReconnectWait
	}
	return o.ReconnectWait
}

// NATSOptions returns the nats.go options for o's credentials and TLS.
// It reads every file once, so that a missing or unreadable one fails
// here rather than as a connection refused later. Errors: invalid
// options, unreadable or empty secret files, an NKey seed that is not a
// user seed, unreadable TLS files, wrapped.
func (o ConnOptions) NATSOptions() ([]nats.Option, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case o.User != "" && o.PasswordFile != "":
		h, err := fileSecret(o.PasswordFile, "password")
		if err != nil {
			return nil, err
		}
		user := o.User
		opts = append(opts, nats.UserInfoHandler(func() (string, string) { return user, h() }))
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.TokenFile != "":
		h, err := fileSecret(o.TokenFile, "token")
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.TokenHandler(h))
	case o.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats: nkey seed file %s: %w", o.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	case o.CredsFile != "":
		if _, err := os.Stat(o.CredsFile); err != nil {
			return nil, fmt.Errorf("nats: creds file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	// The TLS options read their files when applied: apply them once.
	check := nats.GetDefaultOptions()
	for _, opt := range opts {
		if err := opt(&check); err != nil {
			return nil, fmt.Errorf("nats: %w", err)
		}
	}
	return opts, nil
}

// fileSecret reads the secret in path now (an error when unreadable or
// empty) and returns a function that re-reads it, keeping the last good
// value when a re-read fails (a Secret volume being updated).
func fileSecret(path, what string) (func() string, error) {
	read := func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("%s is empty", path)
		}
		return s, nil
	}
	first, err := read()
	if err != nil {
		return nil, fmt.Errorf("nats: %s file: %w", what, err)
	}
	var mu sync.Mutex
	last := first
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		if s, err := read(); err == nil {
			last = s
		}
		return last
	}, nil
}

// Connect connects to the NATS servers (a URL, or a comma-separated
// list) with o's credentials and TLS, as client name, and returns at
// once: when no server is reachable yet, or one refuses the credentials,
// the connection retries in the background, forever, with o's backoff;
// after a disconnect it reconnects the same way. Check IsConnected before
// relying on it (pdserve's components stay not-ready until then).
// Subscriptions made meanwhile are registered when it connects; while it
// is not connected, Publisher skips heartbeats. log (nil: none) gets
// connects, disconnects, failed attempts and asynchronous errors such as
// permission violations, with credentials in URLs redacted. extra
// options are applied last (the caller's ClosedHandler, DrainTimeout).
// Errors: invalid options or files (see NATSOptions), a malformed URL,
// wrapped.
func (o ConnOptions) Connect(servers, name string, log *zap.Logger, extra ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = zap.NewNop()
	}
	auth, err := o.NATSOptions()
	if err != nil {
		return nil, err
	}
	log = log.With(zap.String("nats_url", RedactURL(servers)))
	wait := o.reconnectWait()
	opts := []nats.Option{
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		// Credentials may be fixed (a rotated Secret) while we retry.
		nats.IgnoreAuthErrorAbort(),
		nats.CustomReconnectDelay(func(attempts int) time.Duration { return backoff(wait, attempts, rand.Float64()) }),
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info("nats connected", zap.String("server", RedactURL(nc.ConnectedUrl())))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats connected", zap.String("server", RedactURL(nc.ConnectedUrl())), zap.Uint64("reconnects", nc.Stats().Reconnects))
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected; reconnecting", zap.Error(err))
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats connection attempt failed; retrying", zap.Error(err))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			f := []zap.Field{zap.Error(err)}
			if sub != nil {
				f = append(f, zap.String("subject", sub.Subject))
			}
			log.Error("nats error", f...)
		}),
	}
	opts = append(opts, auth...)
	opts = append(opts, extra...)
	nc, err := nats.Connect(servers, opts...)
	if err != nil {
		return nil, fmt.Errorf("control: nats connect %s: %w", RedactURL(servers), err)
	}
	return nc, nil
}

// backoff returns the delay before the attempts-th round of connection
// attempts (1 first): wait·2^(attempts-1), capped at max(10 s, wait), then
// scaled by 1 ± 20 % from u in [0,1).
func backoff(wait time.Duration, attempts int, u float64) time.Duration {
	limit := max(reconnectWaitCap, wait)
	d := wait
	for i := 1; i < attempts && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return time.Duration(float64(d) * (1 + reconnectJitter*(2*u-1)))
}

// RedactURL returns u with the password of every URL in it (a
// comma-separated list) replaced by "redacted", and a user name alone
// (a token) likewise, for logs. Text that is not a URL comes back as it
// was.
func RedactURL(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		pu, err := url.Parse(strings.TrimSpace(p))
		if err != nil || pu.User == nil {
			continue
		}
		if _, ok := pu.User.Password(); ok {
			pu.User = url.UserPassword(pu.User.Username(), "redacted")
		} else {
			pu.User = url.User("redacted")
		}
		parts[i] = pu.String()
	}
	return strings.Join(parts, ",")
}
