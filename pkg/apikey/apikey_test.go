package apikey

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/poll"
)

const (
	keyA = "sk-team-a-0123456789abcdef"
	keyB = "sk-team-b-fedcba9876543210"
)

// line returns the key file line of key, failing the test on error.
func line(t *testing.T, key, name string, rpm, tpm int) string {
	t.Helper()
	l, err := FormatLine(key, name, rpm, tpm)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// writeFile writes content to path, failing the test on error.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestParse(t *testing.T) {
	hashA := Hash(keyA)
	hexA := strings.Fields(line(t, keyA, "", 0, 0))[0]
	tests := []struct {
		name     string
		file     string
		want     []Entry
		wantErr  error  // nil: success
		wantText string // substring of the error
	}{
		{
			name: "comments, blank lines, CRLF, fields in any order",
			file: "# keys\n\n" + hexA + " tpm=200000 name=team-a rpm=600 # trailing comment\r\n   \n",
			want: []Entry{{Digest: hashA, Name: "team-a", RPM: 600, TPM: 200000, Line: 3}},
		},
		{name: "tenant", file: hexA + " tenant=public name=a", want: []Entry{{Digest: hashA, Name: "a", Tenant: "public", Line: 1}}},
		{name: "bad tenant", file: hexA + " tenant=a/b", wantErr: ErrInvalid, wantText: "tenant must be"},
		{name: "upper-case prefix", file: strings.ToUpper(hexA[:7]) + strings.ToUpper(hexA[7:]), wantErr: ErrPlaintext, wantText: "line 1"},
		{name: "upper-case hex", file: HashPrefix + strings.ToUpper(hexA[7:]), want: []Entry{{Digest: hashA, Line: 1}}},
		{name: "plaintext key", file: "# ok\n" + hexA + "\n" + keyB + " name=b\n", wantErr: ErrPlaintext, wantText: "line 3"},
		{name: "short hash", file: hexA[:40], wantErr: ErrInvalid, wantText: "line 1: invalid: sha256: must be followed by 64 hex digits, not 33"},
		{name: "not hex", file: hexA[:70] + "zz", wantErr: ErrInvalid, wantText: "line 1"},
		{name: "unknown field", file: hexA + " " + keyB, wantErr: ErrInvalid, wantText: "line 1: invalid: field 2 must be name=, tenant=, rpm= or tpm="},
		{name: "field twice", file: hexA + " rpm=1 rpm=2", wantErr: ErrInvalid, wantText: "rpm= given twice"},
		{name: "zero limit", file: hexA + " rpm=0", wantErr: ErrInvalid, wantText: "rpm must be an integer in [1, 100000000]"},
		{name: "limit too large", file: hexA + " tpm=100000001", wantErr: ErrInvalid, wantText: "tpm must be"},
		{name: "bad name", file: hexA + " name=a/b", wantErr: ErrInvalid, wantText: "name must be"},
		{name: "empty name", file: hexA + " name=", wantErr: ErrInvalid, wantText: "name must be"},
		{name: "same key twice", file: hexA + "\n" + hexA + " name=x\n", wantErr: ErrInvalid, wantText: "line 2: invalid: the same key as line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.file))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("Parse (-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("Parse error = %v, want %v with %q", err, tc.wantErr, tc.wantText)
			}
			for _, secret := range []string{keyA, keyB, hexA[7:]} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q holds %q", err, secret)
				}
			}
		})
	}
}

func TestFormatLine(t *testing.T) {
	tests := []struct {
		name           string
		key, keyName   string
		rpm, tpm       int
		wantSuffix     string
		wantErrContain string
	}{
		{name: "hash only", key: keyA},
		{name: "name and limits", key: keyA, keyName: "team-a", rpm: 600, tpm: 200000, wantSuffix: " name=team-a rpm=600 tpm=200000"},
		{name: "short key", key: "short", wantErrContain: "fewer than 16"},
		{name: "space in key", key: "sk-abcdefgh ijklmnop", wantErrContain: "byte 11"},
		{name: "bad name", key: keyA, keyName: "a b", wantErrContain: "name must be"},
		{name: "negative limit", key: keyA, rpm: -1, wantErrContain: "rpm -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := FormatLine(tc.key, tc.keyName, tc.rpm, tc.tpm)
			if tc.wantErrContain != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErrContain) || strings.Contains(err.Error(), tc.key) {
					t.Fatalf("FormatLine error = %v, want ErrInvalid with %q and without the key", err, tc.wantErrContain)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(l, HashPrefix) || len(strings.Fields(l)[0]) != len(HashPrefix)+64 || !strings.HasSuffix(l, tc.wantSuffix) {
				t.Errorf("FormatLine = %q", l)
			}
			// The line round-trips: it parses to the entry that
			// authenticates the key.
			es, err := Parse([]byte(l + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			want := []Entry{{Digest: Hash(tc.key), Name: tc.keyName, RPM: tc.rpm, TPM: tc.tpm, Line: 1}}
			if diff := cmp.Diff(want, es); diff != "" {
				t.Errorf("Parse(FormatLine) (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAuthenticate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, line(t, keyA, "team-a", 0, 0)+"\n"+line(t, keyB, "", 0, 0)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	prefixB := DigestPrefix(Hash(keyB))
	tests := []struct {
		presented string
		want      string // the key's Name; "" for none
	}{
		{keyA, "team-a"},
		{keyB, "sha256:" + prefixB},
		{"", ""},
		{keyA + "x", ""},
		{strings.ToUpper(keyA), ""},
	}
	for _, tc := range tests {
		t.Run(tc.presented, func(t *testing.T) {
			k := keys.Authenticate(tc.presented)
			switch {
			case tc.want == "" && k != nil:
				t.Errorf("Authenticate = %q, want none", k.Name)
			case tc.want != "" && (k == nil || k.Name != tc.want):
				t.Errorf("Authenticate = %+v, want %q", k, tc.want)
			}
		})
	}
	if diff := cmp.Diff([]string{"sha256:" + prefixB, "team-a"}, keys.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	if k := keys.Authenticate(keyB); k.Prefix != prefixB {
		t.Errorf("Prefix = %q, want %q", k.Prefix, prefixB)
	}
}

// The buckets refill continuously at limit a minute; remaining and reset
// are exact for a given clock.
func TestLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, line(t, keyA, "a", 2, 100)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	k := keys.Authenticate(keyA)
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		at   time.Duration // since t0
		op   string        // "req", "tok", "give" (settle n taken, 0 used), "spend" (0 taken, n used)
		n    int
		want Quota
	}
	w := func(limit, remaining int, reset time.Duration) Window {
		return Window{Limit: limit, Remaining: remaining, Reset: reset}
	}
	steps := []step{
		{0, "req", 1, Quota{Requests: w(2, 1, 30*time.Second), Tokens: w(100, 100, 0)}},
		{0, "tok", 15, Quota{Requests: w(2, 1, 30*time.Second), Tokens: w(100, 85, 9*time.Second)}},
		{time.Second, "req", 1, Quota{Requests: w(2, 0, 59*time.Second), Tokens: w(100, 86, 8*time.Second)}},
		// 1 s later: 2/60 of a request back, not a whole one; a request
		// comes back 30 s after the first was taken.
		{2 * time.Second, "req", 1, Quota{Requests: w(2, 0, 58*time.Second), Tokens: w(100, 88, 7*time.Second),
			Exceeded: Requests, Requested: 1, RetryAfter: 28 * time.Second}},
		{30 * time.Second, "req", 1, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 100, 0)}},
		{30 * time.Second, "tok", 101, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 100, 0),
			Exceeded: Tokens, Requested: 101}},
		{30 * time.Second, "tok", 100, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 0, 60*time.Second)}},
		{30 * time.Second, "tok", 1, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 0, 60*time.Second),
			Exceeded: Tokens, Requested: 1, RetryAfter: 600 * time.Millisecond}},
		{30 * time.Second, "give", 30, Quota{}},
		// Used beyond what was taken: charged after the fact, never
		// refused, into debt (before: down to empty, the 5 over forgiven).
		{30 * time.Second, "spend", 10, Quota{}},
		{30 * time.Second, "tok", 0, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 20, 48*time.Second)}},
		{30 * time.Second, "spend", 25, Quota{}},
		{30 * time.Second, "tok", 0, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 0, 63*time.Second)}},
		// In debt by 5: a token is 6 tokens of refill away.
		{30 * time.Second, "tok", 1, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 0, 63*time.Second),
			Exceeded: Tokens, Requested: 1, RetryAfter: 3600 * time.Millisecond}},
		{30 * time.Second, "give", 30, Quota{}},
		// A clock that goes back stands still.
		{29 * time.Second, "tok", 0, Quota{Requests: w(2, 0, 60*time.Second), Tokens: w(100, 25, 45*time.Second)}},
		// 1 ms: 100/60000 of a token; the reset rounds up to the ms.
		{30*time.Second + time.Millisecond, "tok", 0, Quota{Requests: w(2, 0, 59999*time.Millisecond), Tokens: w(100, 25, 44999*time.Millisecond)}},
		{time.Hour, "tok", 0, Quota{Requests: w(2, 2, 0), Tokens: w(100, 100, 0)}},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		var got Quota
		switch s.op {
		case "req":
			got = k.TakeRequest(now)
		case "tok":
			got = k.TakeTokens(now, s.n)
		case "give": // taken and not used
			k.SettleTokens(now, s.n, 0)
			continue
		case "spend": // used and not taken
			k.SettleTokens(now, 0, s.n)
			continue
		}
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Fatalf("step %d (%v %s %d) (-want +got):\n%s", i, s.at, s.op, s.n, diff)
		}
		if got.OK() != (s.want.Exceeded == "") || !got.Limited() {
			t.Fatalf("step %d: OK %v, Limited %v", i, got.OK(), got.Limited())
		}
	}
}

func TestUnlimitedKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, line(t, keyA, "a", 0, 0)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	k := keys.Authenticate(keyA)
	now := time.Unix(0, 0)
	for range 1000 {
		if q := k.TakeRequest(now); !q.OK() || q.Limited() {
			t.Fatalf("unlimited key: %+v", q)
		}
	}
	if q := k.TakeTokens(now, MaxLimit*10); !q.OK() || q.Limited() {
		t.Fatalf("unlimited key: %+v", q)
	}
}

// TestTokenDebt: what a request used beyond what it took is owed however
// much it is, down to one limit below empty: the key waits for the
// refill to pay it back, and no level overflows at MaxLimit, where the
// floor is a little higher. A settle of more taken than used gives the
// rest back.
func TestTokenDebt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	keyC := "sk-team-c-00112233445566778"
	writeFile(t, path, line(t, keyA, "a", 0, 100)+"\n"+line(t, keyB, "b", 0, MaxLimit)+"\n"+line(t, keyC, "c", 0, 100)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)

	a := keys.Authenticate(keyA)
	a.SettleTokens(t0, 0, 1000) // 1,000 used: owed down to −100
	if q := a.TakeTokens(t0, 1); q.OK() || q.Tokens.Remaining != 0 || q.Tokens.Reset != 2*time.Minute || q.RetryAfter != 60600*time.Millisecond {
		t.Errorf("100 in debt: %+v; want refused for 60.6 s, reset in 2 min", q)
	}
	if q := a.TakeTokens(t0.Add(60600*time.Millisecond), 1); !q.OK() || q.Tokens.Remaining != 0 {
		t.Errorf("debt paid back: %+v; want the token", q)
	}
	if q := a.TakeTokens(t0.Add(3*time.Minute), 100); !q.OK() {
		t.Errorf("3 min later: %+v; want the whole limit", q)
	}

	b := keys.Authenticate(keyB)
	b.SettleTokens(t0, 0, 3*MaxLimit)
	q := b.TakeTokens(t0, 1)
	// The floor: −(MaxInt64 − 6·10¹⁸)/6·10¹⁰ ≈ −53.7 million tokens.
	if q.OK() || q.Tokens.Remaining != 0 || q.Tokens.Reset != 92234*time.Millisecond || q.RetryAfter != 32234*time.Millisecond {
		t.Errorf("MaxLimit in debt: %+v; want refused for 32.234 s, reset in 92.234 s", q)
	}
	if q := b.TakeTokens(t0.Add(93*time.Second), MaxLimit); !q.OK() {
		t.Errorf("MaxLimit 93 s later: %+v; want the whole limit", q)
	}

	c := keys.Authenticate(keyC)
	c.TakeTokens(t0, 60)
	c.SettleTokens(t0, 60, 20) // 40 back
	if q := c.TakeTokens(t0, 0); q.Tokens.Remaining != 80 {
		t.Errorf("60 taken, 20 used: %d remaining, want 80", q.Tokens.Remaining)
	}
}

// A reload replaces the keys at once: a removed key fails, a kept key
// keeps its buckets (capped at a lowered limit), and a reload that fails
// keeps the old keys.
func TestReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, line(t, keyA, "a", 10, 0)+"\n"+line(t, keyB, "b", 0, 0)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	kA := keys.Authenticate(keyA)
	for range 4 {
		kA.TakeRequest(now)
	}
	if changed, err := keys.ReloadIfChanged(); changed || err != nil {
		t.Fatalf("ReloadIfChanged of an unchanged file = %v, %v", changed, err)
	}

	// Revoke B; lower A's limit to 8: A keeps its 6 remaining requests.
	writeFile(t, path, line(t, keyA, "a2", 8, 0)+"\n")
	if changed, err := keys.Reload(); !changed || err != nil {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	if k := keys.Authenticate(keyB); k != nil {
		t.Fatalf("revoked key still authenticates as %q", k.Name)
	}
	k := keys.Authenticate(keyA)
	if k == nil || k.Name != "a2" {
		t.Fatalf("kept key = %+v", k)
	}
	if q := k.TakeRequest(now); q.Requests.Limit != 8 || q.Requests.Remaining != 5 {
		t.Errorf("kept key after reload: %+v, want limit 8 remaining 5", q.Requests)
	}
	if rpm, tpm := kA.Limits(); rpm != 8 || tpm != 0 {
		t.Errorf("old Key's limits = %d, %d; want the shared 8, 0", rpm, tpm)
	}

	// A plaintext key: the reload fails, naming the line, and the keys
	// stay; the same bad content is not tried again until it changes.
	writeFile(t, path, line(t, keyA, "a2", 8, 0)+"\n"+keyB+"\n")
	_, err = keys.ReloadIfChanged()
	if !errors.Is(err, ErrPlaintext) || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), keyB) {
		t.Fatalf("ReloadIfChanged error = %v, want ErrPlaintext on line 2 without the key", err)
	}
	if keys.Authenticate(keyA) == nil || keys.Len() != 1 {
		t.Fatal("a failed reload dropped the keys")
	}
	if changed, err := keys.ReloadIfChanged(); changed || err != nil {
		t.Errorf("ReloadIfChanged of the same bad file = %v, %v; want no retry", changed, err)
	}
	if _, err := keys.Reload(); !errors.Is(err, ErrPlaintext) {
		t.Errorf("forced Reload of the bad file = %v, want ErrPlaintext", err)
	}

	// A missing file: the error is reported once, the keys stay.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.ReloadIfChanged(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReloadIfChanged of a missing file = %v", err)
	}
	if changed, err := keys.ReloadIfChanged(); changed || err != nil {
		t.Errorf("second ReloadIfChanged of a missing file = %v, %v; want quiet", changed, err)
	}
	if keys.Authenticate(keyA) == nil {
		t.Fatal("a missing file dropped the keys")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	writeFile(t, plain, "# team a\n"+keyA+" name=a\n")
	_, err := Load(plain)
	if !errors.Is(err, ErrPlaintext) || !strings.Contains(err.Error(), plain+": line 2") || strings.Contains(err.Error(), keyA) {
		t.Errorf("Load(plaintext) = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
}

func TestToken(t *testing.T) {
	const tok = "metrics-token-0123456789"
	path := filepath.Join(t.TempDir(), "token")
	writeFile(t, path, tok+"\n")
	mt, err := LoadToken(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		presented string
		want      bool
	}{{tok, true}, {tok + "\n", false}, {"", false}, {tok[:len(tok)-1], false}} {
		if got := mt.Check(tc.presented); got != tc.want {
			t.Errorf("Check(%q) = %v, want %v", tc.presented, got, tc.want)
		}
	}
	writeFile(t, path, "short\n")
	if _, err := mt.Reload(); !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "short") {
		t.Errorf("Reload(short token) = %v", err)
	}
	if !mt.Check(tok) {
		t.Error("a failed reload dropped the token")
	}
	writeFile(t, path, "  new-metrics-token-abcdef  \n")
	if _, err := mt.Reload(); err != nil || mt.Check(tok) || !mt.Check("new-metrics-token-abcdef") {
		t.Errorf("Reload(new token) = %v; old valid %v", err, mt.Check(tok))
	}
	if _, err := LoadToken(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadToken(missing) = %v", err)
	}
}

// Watch reloads a changed file on a tick and every file on a signal, and
// logs both and a failure without a secret.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys")
	writeFile(t, path, line(t, keyA, "a", 0, 0)+"\n"+line(t, keyB, "b", 0, 0)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	clock, now := fakeClock()
	keys.now = now
	core, logs := observer.New(zapcore.InfoLevel)
	var failures atomic.Int32
	tick := make(chan time.Time)
	force := make(chan os.Signal)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, tick, force, zap.New(core), func() { failures.Add(1) }, keys)
	}()

	// Revoke B: the next tick reloads.
	writeFile(t, path, line(t, keyA, "a", 0, 0)+"\n")
	tick <- time.Now()
	poll.WaitFor(t, "the tick's reload", func() bool { return keys.Authenticate(keyB) == nil })

	// A plaintext key: the reload fails and A stays.
	writeFile(t, path, line(t, keyA, "a", 0, 0)+"\n"+keyB+"\n")
	tick <- time.Now()
	poll.WaitFor(t, "the failed reload's log", func() bool { return logs.FilterMessageSnippet("reload failed").Len() == 1 })
	if keys.Authenticate(keyA) == nil {
		t.Fatal("a failed reload dropped the keys")
	}

	// A signal reloads even a file that looks unchanged.
	writeFile(t, path, line(t, keyB, "b", 0, 0)+"\n")
	force <- syscall.SIGHUP
	poll.WaitFor(t, "the signal's reload", func() bool { return keys.Authenticate(keyA) == nil && keys.Authenticate(keyB) != nil })

	// A deleted file keeps the last good keys, reported (once).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	tick <- time.Now()
	tick <- time.Now()
	poll.WaitFor(t, "the missing file's log", func() bool { return logs.FilterMessageSnippet("reload failed").Len() == 2 })
	if keys.Authenticate(keyB) == nil {
		t.Fatal("a deleted key file dropped the keys")
	}
	// An empty file revokes every key, once a look EmptyGrace after the
	// first still finds it so (the first could have caught a file being
	// rewritten).
	writeFile(t, path, "# every key revoked\n")
	tick <- time.Now()
	tick <- time.Now() // received once the first look is done
	clock.Add(int64(EmptyGrace))
	tick <- time.Now()
	poll.WaitFor(t, "the empty file's reload", func() bool { return keys.Authenticate(keyB) == nil && keys.Len() == 0 })
	cancel()
	<-done
	if got := failures.Load(); got != 2 {
		t.Errorf("%d failures reported, want 2 (the plaintext key, the deleted file)", got)
	}

	var triggers []string
	for _, e := range logs.All() {
		triggers = append(triggers, e.Message+" "+e.ContextMap()["trigger"].(string))
		for _, secret := range []string{keyA, keyB} {
			if strings.Contains(e.Message, secret) || strings.Contains(strings.Join(fieldStrings(e), " "), secret) {
				t.Errorf("log %q holds a key", e.Message)
			}
		}
	}
	want := []string{"reloaded change", "reload failed; the old contents stay in use change", "reloaded hangup",
		"reload failed; the old contents stay in use change", "reloaded a key file without keys: every key is revoked, every request refused change"}
	if diff := cmp.Diff(want, triggers); diff != "" {
		t.Errorf("logs (-want +got):\n%s", diff)
	}
}

func fieldStrings(e observer.LoggedEntry) []string {
	var out []string
	for k, v := range e.ContextMap() {
		out = append(out, k, fmt.Sprint(v))
	}
	return out
}

// fakeClock returns a Keys clock the test moves with Add (nanoseconds),
// safe for concurrent use.
func fakeClock() (*atomic.Int64, func() time.Time) {
	ns := &atomic.Int64{}
	ns.Store(1_700_000_000 * int64(time.Second))
	return ns, func() time.Time { return time.Unix(0, ns.Load()) }
}

// An emptied key file revokes every key on a look EmptyGrace or more
// after the first that found it so (the first may catch a file being
// rewritten: truncated, not yet written; so may the next ones while the
// writer is descheduled), at once on a forced reload; a file rewritten in
// between is taken as it is.
func TestEmptyFileRevokes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, line(t, keyA, "a", 0, 0)+"\n")
	keys, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	clock, now := fakeClock()
	keys.now = now
	writeFile(t, path, "")
	if changed, err := keys.ReloadIfChanged(); changed || err != nil || keys.Authenticate(keyA) == nil {
		t.Fatalf("first look at the empty file = %v, %v; key kept %v", changed, err, keys.Authenticate(keyA) != nil)
	}
	writeFile(t, path, line(t, keyA, "a", 0, 0)+"\n"+line(t, keyB, "b", 0, 0)+"\n") // the rewrite's content
	if changed, err := keys.ReloadIfChanged(); !changed || err != nil || keys.Len() != 2 {
		t.Fatalf("the rewritten file = %v, %v, %d keys", changed, err, keys.Len())
	}
	writeFile(t, path, "# revoked\n")
	_, _ = keys.ReloadIfChanged()
	clock.Add(int64(EmptyGrace - time.Millisecond))
	if changed, err := keys.ReloadIfChanged(); changed || err != nil || keys.Authenticate(keyA) == nil {
		t.Fatalf("a look within EmptyGrace of the first = %v, %v; key kept %v", changed, err, keys.Authenticate(keyA) != nil)
	}
	clock.Add(int64(time.Millisecond))
	if changed, err := keys.ReloadIfChanged(); !changed || err != nil || keys.Len() != 0 || keys.Authenticate(keyA) != nil {
		t.Fatalf("a look EmptyGrace after the first = %v, %v, %d keys", changed, err, keys.Len())
	}
	writeFile(t, path, line(t, keyB, "b", 0, 0)+"\n")
	if _, err := keys.Reload(); err != nil || keys.Authenticate(keyB) == nil {
		t.Fatalf("Reload = %v", err)
	}
	writeFile(t, path, "")
	if changed, err := keys.Reload(); !changed || err != nil || keys.Len() != 0 {
		t.Fatalf("forced Reload of the empty file = %v, %v, %d keys", changed, err, keys.Len())
	}
	empty, err := Load(path)
	if err != nil || empty.Len() != 0 || empty.Authenticate(keyA) != nil {
		t.Fatalf("Load of an empty file = %v, %d keys", err, empty.Len())
	}
}

// TestTenant: each key is a partition of its own unless the file names a
// tenant, which keys share; two keys with one name (a rotation) are still
// apart. Fails if the partition were the name.
func TestTenant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	keyC := "sk-cccccccccccccccccccc"
	la, lb, lc := line(t, keyA, "x", 0, 0), line(t, keyB, "x", 0, 0), line(t, keyC, "", 0, 0)
	writeFile(t, path, la+"\n"+lb+"\n"+lc+" tenant=shared\n"+strings.Fields(line(t, "sk-dddddddddddddddddddd", "", 0, 0))[0]+" tenant=shared\n")
	ks, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c, d := ks.Authenticate(keyA), ks.Authenticate(keyB), ks.Authenticate(keyC), ks.Authenticate("sk-dddddddddddddddddddd")
	if a == nil || b == nil || c == nil || d == nil {
		t.Fatal("a key did not authenticate")
	}
	if a.Tenant() == b.Tenant() {
		t.Errorf("two keys of one name share the partition %q", a.Tenant())
	}
	if c.Tenant() != d.Tenant() || c.Tenant() != "tenant:shared" {
		t.Errorf("keys naming tenant=shared: partitions %q and %q, want tenant:shared", c.Tenant(), d.Tenant())
	}
	if a.Tenant() == c.Tenant() {
		t.Error("a key without tenant= shares a named tenant's partition")
	}
}
