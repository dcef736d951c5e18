package adversarial

import (
	"strings"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/frontend"
)

// idsBody returns a body of about size bytes: one prompt of token ids 1.
func idsBody(size int) string {
	var b strings.Builder
	b.Grow(size + 32)
	b.WriteString(`{"prompt":[1`)
	for b.Len() < size-20 {
		b.WriteString(",1")
	}
	b.WriteString(`],"max_tokens":1}`)
	return b.String()
}

// TestTokenIDBodies: four concurrent 16 MiB bodies of token ids (8.4 M
// ids each) are refused as over the context while being scanned, and the
// heap stays within the documented bound per request (the body, plus at
// most 4 bytes × the context × the batch limit of ids, which these never
// reach) — 2 × MaxBodyBytes each, generously; they took 600 MiB each
// when the ids were decoded first. A batch of 3 M one-id prompts is
// refused at the prompt over the batch limit.
func TestTokenIDBodies(t *testing.T) {
	d := start(t, nil, nil)
	body := idsBody(coordinator.DefaultMaxBodyBytes - 64)
	const k = 4
	var mu sync.Mutex
	var replies []reply
	peak := heapPeak(func() {
		var wg sync.WaitGroup
		for range k {
			wg.Go(func() {
				r := d.post(t, frontend.RouteCompletions, "", strings.NewReader(body))
				mu.Lock()
				replies = append(replies, r)
				mu.Unlock()
			})
		}
		wg.Wait()
	})
	for _, r := range replies {
		if r.status != 400 || !strings.Contains(r.body, `"context_length_exceeded"`) || !strings.Contains(r.body, `"param":"prompt"`) {
			t.Errorf("status %d %s, want 400 context_length_exceeded on prompt", r.status, r.body)
		}
	}
	bound := uint64(k * 2 * coordinator.DefaultMaxBodyBytes)
	t.Logf("%d concurrent %d-byte token-id bodies: heap peak +%d MiB (bound %d MiB)", k, len(body), peak>>20, bound>>20)
	if peak > bound {
		t.Errorf("heap grew by %d MiB, over the bound of %d MiB", peak>>20, bound>>20)
	}

	var b strings.Builder
	b.WriteString(`{"prompt":[[1]`)
	for range 3_000_000 - 1 {
		b.WriteString(",[1]")
	}
	b.WriteString(`],"max_tokens":1}`)
	batch := b.String()
	var r reply
	peak = heapPeak(func() { r = d.post(t, frontend.RouteCompletions, "", strings.NewReader(batch)) })
	if r.status != 400 || !strings.Contains(r.body, "more than 1024 prompts") {
		t.Errorf("batch of 3 M prompts: status %d %s, want 400 naming the batch limit", r.status, r.body)
	}
	t.Logf("a batch of 3 M prompts (%d bytes): heap peak +%d MiB", len(batch), peak>>20)
	if bound := uint64(2 * len(batch)); peak > bound {
		t.Errorf("heap grew by %d MiB, over %d MiB", peak>>20, bound>>20)
	}
}

// TestMaxTokensOverflow: max_tokens and max_completion_tokens of 2⁶³−1
// are a 400 context_length_exceeded naming the parameter, before any
// worker is asked, and take nothing from the key's tokens a minute.
func TestMaxTokensOverflow(t *testing.T) {
	d := start(t, nil, func(o *coordinator.Options) { o.Auth.APIKeysFile = keyFile(t, keyA+" name=a tpm=100000") })
	for _, tc := range []struct{ path, body, param string }{
		{frontend.RouteCompletions, `{"prompt":"hello","max_tokens":9223372036854775807}`, "max_tokens"},
		{frontend.RouteChat, `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9223372036854775807}`, "max_completion_tokens"},
		{frontend.RouteCompletions, `{"prompt":"hello","max_tokens":4294967297}`, "max_tokens"},
	} {
		r := d.post(t, tc.path, keyA, strings.NewReader(tc.body))
		if r.status != 400 || !strings.Contains(r.body, `"code":"context_length_exceeded"`) || !strings.Contains(r.body, `"param":"`+tc.param+`"`) {
			t.Errorf("%s: status %d %s, want 400 context_length_exceeded on %s", tc.body, r.status, r.body, tc.param)
		}
		if got := r.header.Get("x-ratelimit-remaining-tokens"); got != "100000" && got != "" {
			t.Errorf("%s: %s tokens remaining, want all 100000", tc.body, got)
		}
	}
}
