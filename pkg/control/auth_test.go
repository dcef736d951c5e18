package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// An NKey user seed from nats.go's tests, and its public key.
const (
	testNKeyPublic = "UAT6BWCSCWLUKJT6K6MBJJOEOTXZ5AJDOYKNEVRFC7VNO6OA43N4TRNO"
	testNKeySeed   = "SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY"
)

// startAuthNATS runs an embedded server that requires users, logging to
// log; it is stopped, and goroutine leaks checked, when the test ends.
func startAuthNATS(t *testing.T, users []NATSUser, log *zap.Logger) string {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs last
	s, url, err := StartEmbedded("127.0.0.1:-1", WithUsers(users), WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return url
}

// connectAs connects as o and waits until connected; the connection is
// closed when the test ends.
func connectAs(t *testing.T, url string, o ConnOptions, log *zap.Logger) *nats.Conn {
	t.Helper()
	o.ReconnectWait = 10 * time.Millisecond
	nc, err := o.Connect(url, "test", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected (%v)", nc.Status())
		}
		return nil
	})
	return nc
}

// logged waits until logs has an entry whose message and fields contain
// every one of want, and returns its text.
func logged(t *testing.T, logs *observer.ObservedLogs, want ...string) string {
	t.Helper()
	var text string
	poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		for _, e := range logs.All() {
			text = entryText(e)
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(text, w)
			}
			if ok {
				return nil
			}
		}
		return fmt.Errorf("no log entry with %q among %d", want, logs.Len())
	})
	return text
}

func entryText(e observer.LoggedEntry) string {
	var b strings.Builder
	b.WriteString(e.Message)
	for k, v := range e.ContextMap() {
		fmt.Fprintf(&b, " %s=%v", k, v)
	}
	return b.String()
}

// noSecret fails the test when any log entry contains one of secrets.
func noSecret(t *testing.T, logs *observer.ObservedLogs, secrets ...string) {
	t.Helper()
	for _, e := range logs.All() {
		text := entryText(e)
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("log entry reveals a secret: %s", text)
			}
		}
	}
}

func TestNATSRefusesConnectionsWithoutCredentials(t *testing.T) {
	core, serverLogs := observer.New(zap.DebugLevel)
	coord := NewNATSUser(RoleCoordinator, "")
	worker := NewNATSUser(RoleDecode, "decode-1")
	url := startAuthNATS(t, []NATSUser{coord, worker}, zap.New(core))

	// A client without credentials, or with a wrong password, is refused.
	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"no credentials", nil},
		{"wrong password", []nats.Option{nats.UserInfo(worker.User, "guess")}},
		{"unknown user", []nats.Option{nats.UserInfo("mallory", worker.Password)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := nats.Connect(url, tc.opts...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("error = %v, want an authorization violation", err)
			}
		})
	}
	// The right credentials get in.
	connectAs(t, url, worker.ConnOptions(), nil)

	// pdserve's own connection keeps retrying a refused login, logging
	// each refusal without the password; the server logs the user.
	clientCore, clientLogs := observer.New(zap.DebugLevel)
	bad := ConnOptions{User: worker.User, Password: "not-" + worker.Password, ReconnectWait: 10 * time.Millisecond}
	nc, err := bad.Connect(url, "test", zap.New(clientCore))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	logged(t, clientLogs, "nats connection attempt failed", "uthorization")
	logged(t, serverLogs, "uthentication", worker.User)
	if nc.IsConnected() {
		t.Error("connected with a wrong password")
	}
	noSecret(t, clientLogs, worker.Password, bad.Password)
	noSecret(t, serverLogs, worker.Password, bad.Password)
}

func TestNATSPermissions(t *testing.T) {
	core, serverLogs := observer.New(zap.DebugLevel)
	coord := NewNATSUser(RoleCoordinator, "")
	d1 := NewNATSUser(RoleDecode, "decode-1")
	d2 := NewNATSUser(RoleDecode, "decode-2")
	shared := NewNATSUser(RoleDecode, "")
	p0 := NewNATSUser(RolePrefill, "prefill-0")
	e0 := NewNATSUser(RoleElastic, "elastic-0")
	obs := NATSUser{NKey: testNKeyPublic, Role: RoleObserver}
	url := startAuthNATS(t, []NATSUser{coord, d1, d2, shared, p0, e0, obs}, zap.New(core))

	watchCore, watchLogs := observer.New(zap.DebugLevel)
	cnc := connectAs(t, url, coord.ConnOptions(), nil)
	m := NewMembership(time.Minute)
	stop, err := Watch(context.Background(), cnc, m, time.Now, time.Hour, WatchLogger(zap.New(watchCore)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// decode-2 takes commands; what reaches it is recorded.
	d2nc := connectAs(t, url, d2.ConnOptions(), nil)
	got := make(chan Command, 8)
	if _, err := HandleCommands(d2nc, "decode", "decode-2", func(c Command) error { got <- c; return nil }); err != nil {
		t.Fatal(err)
	}

	beat := func(id, role string) []byte {
		b, _ := json.Marshal(Heartbeat{ID: id, Role: role, GRPCAddr: "10.9.9.9:1"})
		return b
	}
	tests := []struct {
		name    string
		as      NATSUser
		subject string
		data    []byte
		refused string // the permission violation's text, or "" when NATS lets it through
		member  string // the id that must (not) join
		joins   bool
	}{
		{"worker heartbeat under another worker's id", d1, HeartbeatSubject("decode", "decode-2"), beat("decode-2", "decode"),
			`Permissions Violation for Publish to "pdserve.hb.decode.decode-2"`, "decode-2", false},
		{"worker heartbeat under another role", d1, HeartbeatSubject("prefill", "decode-1"), beat("decode-1", "prefill"),
			`Permissions Violation for Publish to "pdserve.hb.prefill.decode-1"`, "decode-1", false},
		{"shared credential, another role", shared, HeartbeatSubject("prefill", "prefill-0"), beat("prefill-0", "prefill"),
			`Permissions Violation for Publish to "pdserve.hb.prefill.prefill-0"`, "prefill-0", false},
		{"worker command to another worker", d1, CommandSubject("decode", "decode-2"), []byte(`{"kind":"drain"}`),
			`Permissions Violation for Publish to "pdserve.cmd.decode.decode-2"`, "", false},
		{"prefill worker command", p0, CommandSubject("decode", "decode-2"), []byte(`{"kind":"drain"}`),
			`Permissions Violation for Publish to "pdserve.cmd.decode.decode-2"`, "", false},
		{"worker plan", d1, PlanSubject, []byte(`{}`), `Permissions Violation for Publish to "pdserve.plan"`, "", false},
		{"own heartbeat", d1, HeartbeatSubject("decode", "decode-1"), beat("decode-1", "decode"), "", "decode-1", true},
		{"elastic worker heartbeat under another id", e0, HeartbeatSubject("decode", "decode-2"), beat("decode-2", "decode"),
			`Permissions Violation for Publish to "pdserve.hb.decode.decode-2"`, "decode-2", false},
		{"elastic worker role command", e0, CommandSubject("decode", "decode-2"), []byte(`{"kind":"role","arg":"prefill"}`),
			`Permissions Violation for Publish to "pdserve.cmd.decode.decode-2"`, "", false},
		{"elastic worker heartbeat as prefill", e0, HeartbeatSubject("prefill", "elastic-0"), beat("elastic-0", "prefill"), "", "elastic-0", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.DebugLevel)
			nc := connectAs(t, url, tc.as.ConnOptions(), zap.New(core))
			if err := nc.Publish(tc.subject, tc.data); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if tc.refused == "" {
				poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
					if _, ok := m.Get(tc.member); !ok {
						return fmt.Errorf("%s not a member", tc.member)
					}
					return nil
				})
				return
			}
			// The server sends the violation after dropping the message:
			// once it is logged, nothing was delivered.
			logged(t, logs, "nats error", tc.refused)
			logged(t, serverLogs, "Publish Violation", tc.subject)
			if tc.member != "" {
				if _, ok := m.Get(tc.member); ok {
					t.Errorf("%s joined the membership", tc.member)
				}
			}
			noSecret(t, logs, tc.as.Password)
			noSecret(t, serverLogs, tc.as.Password)
		})
	}
	select {
	case c := <-got:
		t.Errorf("decode-2 received %+v from a worker", c)
	default:
	}

	// A worker cannot take another worker's commands either.
	core2, logs2 := observer.New(zap.DebugLevel)
	d1nc := connectAs(t, url, d1.ConnOptions(), zap.New(core2))
	if _, err := d1nc.Subscribe(CommandSubject("decode", "decode-2"), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	logged(t, logs2, "nats error", `Permissions Violation for Subscription to "pdserve.cmd.decode.decode-2"`)

	// The coordinator's command reaches decode-2, whose reply is allowed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := SendCommand(ctx, cnc, "decode", "decode-2", Command{Kind: CmdDrain}); err != nil {
		t.Fatalf("coordinator's command: %v", err)
	}
	if c := <-got; c.Kind != CmdDrain {
		t.Errorf("decode-2 got %+v", c)
	}

	// An elastic worker takes its commands in every worker role and
	// publishes its heartbeats in each: the coordinator sees its new role.
	enc := connectAs(t, url, e0.ConnOptions(), nil)
	for _, role := range []string{"decode", "colocated", "prefill"} {
		sub, err := HandleCommands(enc, role, "elastic-0", func(Command) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if err := SendCommand(ctx, cnc, role, "elastic-0", Command{Kind: CmdRole, Arg: "decode"}); err != nil {
			t.Errorf("command to the elastic worker as %s: %v", role, err)
		}
		_ = sub.Unsubscribe()
		if err := enc.Publish(HeartbeatSubject(role, "elastic-0"), beat("elastic-0", role)); err != nil {
			t.Fatal(err)
		}
		poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			if hb, ok := m.Get("elastic-0"); !ok || hb.Role != role {
				return fmt.Errorf("elastic-0 not a member as %s (%+v)", role, hb)
			}
			return nil
		})
	}

	// A credential the decode replicas share may publish any decode id
	// (NATS cannot tell them apart), but the coordinator refuses a
	// heartbeat whose payload differs from its subject.
	snc := connectAs(t, url, shared.ConnOptions(), nil)
	if err := snc.Publish(HeartbeatSubject("decode", "decode-7"), beat("decode-8", "decode")); err != nil {
		t.Fatal(err)
	}
	logged(t, watchLogs, "heartbeat refused", "pdserve.hb.decode.decode-7", "decode-8")
	for _, id := range []string{"decode-7", "decode-8"} {
		if _, ok := m.Get(id); ok {
			t.Errorf("%s joined from a heartbeat whose id differs from its subject", id)
		}
	}

	// An NKey observer reads heartbeats and publishes nothing.
	seed := filepath.Join(t.TempDir(), "seed")
	if err := os.WriteFile(seed, []byte(testNKeySeed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	core3, logs3 := observer.New(zap.DebugLevel)
	onc := connectAs(t, url, ConnOptions{NKeySeedFile: seed}, zap.New(core3))
	if _, err := onc.SubscribeSync(HeartbeatWildcard); err != nil {
		t.Fatal(err)
	}
	if err := onc.Publish(HeartbeatSubject("decode", "decode-1"), beat("decode-1", "decode")); err != nil {
		t.Fatal(err)
	}
	logged(t, logs3, "nats error", `Permissions Violation for Publish to "pdserve.hb.decode.decode-1"`)
	noSecret(t, logs3, testNKeySeed)

	// A prefill worker reads the heartbeats of decode workers (their codec
	// speeds) with WatchRoles, and no other role's.
	core4, logs4 := observer.New(zap.DebugLevel)
	pnc := connectAs(t, url, p0.ConnOptions(), zap.New(core4))
	pm := NewMembership(time.Minute)
	pstop, err := Watch(context.Background(), pnc, pm, time.Now, time.Hour, WatchRoles(RoleDecode, RoleColocated))
	if err != nil {
		t.Fatal(err)
	}
	defer pstop()
	speeds := []CodecSpeed{{Codec: "bf16", EncodeBytesPerSec: 7e8, DecodeBytesPerSec: 1.2e9, Ratio: 1.46}}
	hb, _ := json.Marshal(Heartbeat{ID: "decode-1", Role: "decode", GRPCAddr: "10.9.9.9:1", CodecSpeeds: speeds, CodecCores: 3})
	if err := d1nc.Publish(HeartbeatSubject("decode", "decode-1"), hb); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		got, ok := pm.Get("decode-1")
		if !ok {
			return errors.New("decode-1 not a member of the prefill worker's view")
		}
		if diff := cmp.Diff(speeds, got.CodecSpeeds); diff != "" || got.CodecCores != 3 {
			return fmt.Errorf("codec speeds (-want +got):\n%s; cores %d", diff, got.CodecCores)
		}
		return nil
	})
	if _, err := pnc.SubscribeSync(HeartbeatSubject("prefill", "*")); err != nil {
		t.Fatal(err)
	}
	logged(t, logs4, "nats error", `Permissions Violation for Subscription to "pdserve.hb.prefill.*"`)
}

func TestConnectWaitsForTheServer(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	port := freePort(t)
	core, logs := observer.New(zap.DebugLevel)
	u := NewNATSUser(RoleDecode, "d")
	o := u.ConnOptions()
	o.ReconnectWait = 10 * time.Millisecond
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	nc, err := o.Connect(url, "test", zap.New(core))
	if err != nil {
		t.Fatalf("Connect with no server up: %v", err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected to nothing")
	}
	logged(t, logs, "nats connection attempt failed")

	s, _, err := StartEmbedded("127.0.0.1:"+strconv.Itoa(port), WithUsers([]NATSUser{u}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if !nc.IsConnected() {
			return errors.New("not connected after the server came up")
		}
		return nil
	})
	logged(t, logs, "nats connected")
	noSecret(t, logs, u.Password)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestConnOptionsTLS(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ca := tlstest.NewCA(t, "nats CA")
	srv := ca.Issue(t, tlstest.Leaf{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	client := ca.Issue(t, tlstest.Leaf{})
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CaFile: ca.CertFile, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, TLS: true, TLSVerify: true, TLSConfig: tc})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("TLS server not ready")
	}
	url := s.ClientURL()

	connectAs(t, url, ConnOptions{TLSCA: ca.CertFile, TLSCert: client.CertFile, TLSKey: client.KeyFile}, nil)

	// Without a client certificate the server refuses the handshake.
	core, logs := observer.New(zap.DebugLevel)
	nc, err := ConnOptions{TLSCA: ca.CertFile, ReconnectWait: 10 * time.Millisecond}.Connect(url, "test", zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	logged(t, logs, "nats connection attempt failed")
	if nc.IsConnected() {
		t.Error("connected without a client certificate")
	}

	if _, err := (ConnOptions{TLSCA: filepath.Join(t.TempDir(), "missing.crt")}).NATSOptions(); err == nil {
		t.Error("NATSOptions with a missing CA file = nil error")
	}
}

func TestConnOptionsValidate(t *testing.T) {
	tests := []struct {
		name     string
		o        ConnOptions
		wantAuth string
		wantErr  string
	}{
		{"none", ConnOptions{}, AuthNone, ""},
		{"user", ConnOptions{User: "u", PasswordFile: "/p"}, AuthUser, ""},
		{"user in code", ConnOptions{User: "u", Password: "x"}, AuthUser, ""},
		{"token", ConnOptions{TokenFile: "/t"}, AuthToken, ""},
		{"nkey", ConnOptions{NKeySeedFile: "/s"}, AuthNKey, ""},
		{"creds", ConnOptions{CredsFile: "/c"}, AuthCreds, ""},
		{"tls only", ConnOptions{TLSCA: "/ca", TLSCert: "/c", TLSKey: "/k"}, AuthNone, ""},
		{"user without password", ConnOptions{User: "u"}, AuthUser, "needs --nats-password-file"},
		{"password without user", ConnOptions{PasswordFile: "/p"}, AuthUser, "needs --nats-user"},
		{"two kinds", ConnOptions{TokenFile: "/t", CredsFile: "/c"}, "multiple", "give one of"},
		{"cert without key", ConnOptions{TLSCert: "/c"}, AuthNone, "go together"},
		{"negative wait", ConnOptions{ReconnectWait: -time.Second}, AuthNone, "must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.o.Auth(); got != tc.wantAuth {
				t.Errorf("Auth = %q, want %q", got, tc.wantAuth)
			}
			err := tc.o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate = %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

func TestConnOptionsLogFieldsHaveNoSecrets(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	for _, o := range []ConnOptions{{User: "u", Password: "s3cret-code"}, {User: "u", PasswordFile: pw}} {
		log.Info("effective configuration", o.LogFields()...)
		if _, err := o.NATSOptions(); err != nil {
			t.Errorf("NATSOptions: %v", err)
		}
	}
	logged(t, logs, "nats_auth=user", "nats_user=u", "nats_password_file="+pw)
	noSecret(t, logs, "s3cret")
}

func TestPasswordFileReread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pw")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fileSecret(path, "password"); err == nil {
		t.Error("missing file: nil error")
	}
	write("  \n")
	if _, err := fileSecret(path, "password"); err == nil {
		t.Error("empty file: nil error")
	}
	write("one\n")
	h, err := fileSecret(path, "password")
	if err != nil {
		t.Fatal(err)
	}
	if got := h(); got != "one" {
		t.Errorf("secret %q, want one", got)
	}
	write("two")
	if got := h(); got != "two" {
		t.Errorf("after rotation %q, want two", got)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := h(); got != "two" {
		t.Errorf("after removal %q, want the last good two", got)
	}
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		wait     time.Duration
		attempts int
		u        float64
		want     time.Duration
	}{
		{time.Second, 1, 0.5, time.Second},
		{time.Second, 2, 0.5, 2 * time.Second},
		{time.Second, 4, 0.5, 8 * time.Second},
		{time.Second, 5, 0.5, 10 * time.Second},
		{time.Second, 1000, 0.5, 10 * time.Second},
		{time.Second, 1, 0, 800 * time.Millisecond},
		{time.Second, 5, 1, 12 * time.Second},
		{30 * time.Second, 3, 0.5, 30 * time.Second},
		{10 * time.Millisecond, 2, 0.5, 20 * time.Millisecond},
	}
	for _, tc := range tests {
		if got := backoff(tc.wait, tc.attempts, tc.u); got != tc.want {
			t.Errorf("backoff(%v, %d, %v) = %v, want %v", tc.wait, tc.attempts, tc.u, got, tc.want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":             "nats://127.0.0.1:4222",
		"nats://u:p%40ss@h:4222":            "nats://u:redacted@h:4222",
		"nats://tok@h:4222":                 "nats://redacted@h:4222",
		"nats://a:b@h1:4222,nats://h2:4222": "nats://a:redacted@h1:4222,nats://h2:4222",
		"":                                  "",
		"not a url":                         "not a url",
		"tls://user:secret@nats.example.svc:4222/x?y": "tls://user:redacted@nats.example.svc:4222/x?y",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLoadUsers(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		want    int
		wantErr string
	}{
		{"roles", `users:
  - {user: c, password: "$2a$11$abcdefghijklmnopqrstuu5N1vIS2yOw0y6ZcQzAo1aRzh3YRnqDW", role: coordinator}
  - {user: d, password: x, role: decode}
  - {user: p0, password: y, role: prefill, id: prefill-0}
  - {nkey: ` + testNKeyPublic + `, role: observer}
`, 4, ""},
		{"unknown field", "users:\n  - {user: d, password: x, role: decode, perms: all}\n", 0, "perms"},
		{"no users", "users: []\n", 0, "no users"},
		{"bad role", "users:\n  - {user: d, password: x, role: admin}\n", 0, "unknown NATS role"},
		{"id for the coordinator", "users:\n  - {user: c, password: x, role: coordinator, id: c}\n", 0, "only to worker roles"},
		{"bad id", "users:\n  - {user: d, password: x, role: decode, id: a.b}\n", 0, "not a subject token"},
		{"no password", "users:\n  - {user: d, role: decode}\n", 0, "password is required"},
		{"twice", "users:\n  - {user: d, password: x, role: decode}\n  - {user: d, password: y, role: prefill}\n", 0, "listed twice"},
		{"nkey and user", "users:\n  - {user: d, nkey: " + testNKeyPublic + ", role: decode}\n", 0, "not both"},
		{"bad nkey", "users:\n  - {nkey: SUAM, role: decode}\n", 0, "public user NKey"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "users.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			users, err := LoadUsers(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadUsers = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(users) != tc.want {
				t.Errorf("%d users, want %d", len(users), tc.want)
			}
		})
	}
	if _, err := LoadUsers(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing file: nil error")
	}
}

func TestNewNATSUser(t *testing.T) {
	a, b := NewNATSUser(RoleDecode, "decode-0"), NewNATSUser(RoleDecode, "decode-0")
	if a.User == b.User || a.Password == b.Password {
		t.Errorf("two users alike: %+v %+v", a, b)
	}
	if len(a.Password) != 64 || a.Role != RoleDecode || a.ID != "decode-0" {
		t.Errorf("user %+v", a)
	}
	if err := ValidateUsers([]NATSUser{a, b}); err != nil {
		t.Error(err)
	}
	if _, _, err := StartEmbedded("127.0.0.1:-1", WithUsers(nil)); err == nil {
		t.Error("StartEmbedded WithUsers(nil) = nil error")
	}
}
