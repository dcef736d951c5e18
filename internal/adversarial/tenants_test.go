package adversarial

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/frontend"
)

// TestRefusalsAllLogged: with the binaries' logger (logging.New),
// 500 wrong-key requests in a burst give 500 "request refused" lines and
// 300 completions 300 request lines (sampled before: 104 of 500).
func TestRefusalsAllLogged(t *testing.T) {
	log, count := binaryLogger(t)
	d := start(t, log, func(o *coordinator.Options) { o.Auth.APIKeysFile = keyFile(t, keyA+" name=a") })
	burst := func(n int, key, body string) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				d.post(t, frontend.RouteCompletions, key, strings.NewReader(body))
			})
		}
		wg.Wait()
	}
	before := count("request")
	burst(500, "sk-wrong-wrong-wrong-wrong", `{"prompt":"x"}`)
	burst(300, keyA, `{"prompt":"x","max_tokens":1}`)
	if got := count("request refused"); got != 500 {
		t.Errorf("%d \"request refused\" lines for 500 refusals", got)
	}
	if got := count("request") - before; got != 300 {
		t.Errorf("%d request lines for 300 requests", got)
	}
}

// TestTenants: the response cache does not tell one key what another
// asked; n over the workers' batch is refused naming n; a request over
// the key's whole TPM gets "Request too large" without Retry-After.
func TestTenants(t *testing.T) {
	d := start(t, nil, func(o *coordinator.Options) {
		o.Auth.APIKeysFile = keyFile(t, keyA+" name=a", keyC+" name=c tpm=50")
		o.PolicyEdits = append(o.PolicyEdits, func(p *config.Policy) { p.ResponseCache.Entries = 16 })
	})
	const secret = `{"prompt":"tenant a's secret prompt","max_tokens":4,"temperature":0}`
	for i, key := range []string{keyA, keyA, keyC} {
		r := d.post(t, frontend.RouteCompletions, key, strings.NewReader(secret))
		hit := strings.Contains(r.body, `"cache":"hit"`)
		if r.status != 200 || hit != (i == 1) {
			t.Errorf("request %d: status %d, cache hit %v; want 200, a hit only for tenant a's repeat", i, r.status, hit)
		}
	}
	r := d.post(t, frontend.RouteCompletions, keyA, strings.NewReader(`{"prompt":"a","max_tokens":1,"n":128}`))
	if r.status != 400 || !strings.Contains(r.body, `"param":"n"`) || !strings.Contains(r.body, "1..") {
		t.Errorf("n 128: status %d %s, want 400 on n naming the limit", r.status, r.body)
	}
	r = d.post(t, frontend.RouteCompletions, keyC, strings.NewReader(`{"prompt":"hello","max_tokens":100}`))
	if r.status != 429 || r.header.Get("Retry-After") != "" || !strings.Contains(r.body, "Request too large") || !strings.Contains(r.body, "Limit 50, Requested 105") {
		t.Errorf("over the whole TPM: status %d, Retry-After %q, %s; want 429 Request too large without Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
}

// TestKeyFileRevocation: an emptied key file revokes every key without a
// restart; a deleted one keeps the last good keys, logged and counted in
// pdserve_auth_reload_errors_total.
func TestKeyFileRevocation(t *testing.T) {
	path := keyFile(t, keyA+" name=a")
	d := start(t, nil, func(o *coordinator.Options) {
		o.Auth.APIKeysFile = path
		o.Auth.ReloadInterval = 20 * time.Millisecond
	})
	ok := func() int {
		return d.post(t, frontend.RouteCompletions, keyA, strings.NewReader(`{"prompt":"x","max_tokens":1}`)).status
	}
	if st := ok(); st != 200 {
		t.Fatalf("status %d", st)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, d.Registry(), "pdserve_auth_reload_errors_total"); n < 1 {
			return fmt.Errorf("%v reload errors", n)
		}
		return nil
	})
	if st := ok(); st != 200 {
		t.Errorf("after the key file was deleted: status %d, want 200 (the last good keys)", st)
	}
	writeKeys(t, path) // empty
	poll.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := ok(); st != 401 {
			return fmt.Errorf("after the key file was emptied: status %d, want 401", st)
		}
		return nil
	})
}
