package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// cacheBlock is the fake prefix cache's block: 16 tokens, one byte each
// (the bytes tokenizer), as a pdserve worker's KV block.
const cacheBlock = 16

// cacheServer is an OpenAI-compatible server with a prefix cache: it
// keeps every full block of every prompt it served (keyed by the prompt up
// to the block's end, so a block hits only after the same prefix) and
// reports, in the pdserve budget object, the prompt's leading blocks it
// held as prefix_hit_tokens. It records the prompts in arrival order.
type cacheServer struct {
	*httptest.Server
	mu      sync.Mutex
	prompts []string
	blocks  map[string]bool
}

func newCacheServer(t *testing.T) *cacheServer {
	f := &cacheServer{blocks: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.prompts = append(f.prompts, body.Prompt)
		hit, missed := 0, false
		for end := cacheBlock; end <= len(body.Prompt); end += cacheBlock {
			key := body.Prompt[:end]
			if f.blocks[key] && !missed {
				hit = end
			} else {
				missed = true
			}
			f.blocks[key] = true
		}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for range body.MaxTokens {
			io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n")
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}],"+
			"\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d},"+
			"\"pdserve\":{\"prefill_ms\":1,\"prompt_tokens\":%d,\"prefix_hit_tokens\":%d}}\n\n", len(body.Prompt), body.MaxTokens, len(body.Prompt), hit)
		io.WriteString(w, "data: [DONE]\n\n")
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// probes returns the prompts the server got, n per probe: a probe's
// requests all end before the next probe starts.
func (f *cacheServer) probes(t *testing.T, n int) [][]string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.prompts)%n != 0 {
		t.Fatalf("%d prompts are not whole probes of %d", len(f.prompts), n)
	}
	var out [][]string
	for i := 0; i < len(f.prompts); i += n {
		out = append(out, f.prompts[i:i+n])
	}
	return out
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// compareOnCaches runs a comparison of three probes (40, 80 and 160
// req/s) of 6 prompts each on two cache servers and returns them, the
// Markdown and the result JSON.
func compareOnCaches(t *testing.T, extra ...string) (*cacheServer, *cacheServer, string, map[string]any) {
	t.Helper()
	a, b := newCacheServer(t), newCacheServer(t)
	dir := t.TempDir()
	args := append([]string{"compare", "--disagg-url", a.URL, "--coloc-url", b.URL, "--gpus", "3", "--num-prompts", "6",
		"--random-input-len", "64", "--random-output-len", "2", "--goodput", "ttft:60000", "tpot:60000",
		"--request-rates", "40,80", "--search-steps", "1", "--quiet", "--no-plots",
		"--save-result", "--result-dir", dir, "--result-filename", "c.json"}, extra...)
	code, stdout, stderr := runCLI(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	return a, b, stdout, readJSON(t, filepath.Join(dir, "c.json"))
}

// No two probes of one comparison share a prompt prefix beyond the
// requested shared prefix plus less than a KV block, on either side: a
// probe can hit no KV an earlier probe left but the shared prefix. (Before
// each probe drew its own content, every probe replayed the prompts of
// the first, whole.)
func TestCompareProbesSendFreshPrompts(t *testing.T) {
	const prefix = 32
	a, b, _, res := compareOnCaches(t, "--random-prefix-len", fmt.Sprint(prefix))
	for _, srv := range []*cacheServer{a, b} {
		probes := srv.probes(t, 6)
		if len(probes) != 3 {
			t.Fatalf("%d probes, want 3 (40, 80, 160 req/s)", len(probes))
		}
		for i := range probes {
			for j := i + 1; j < len(probes); j++ {
				for _, p := range probes[i] {
					for _, q := range probes[j] {
						if n := commonPrefix(p, q); n < prefix || n >= prefix+cacheBlock {
							t.Fatalf("probes %d and %d share a %d-token prefix, want the %d requested (and under a block more):\n%q\n%q", i, j, n, prefix, p, q)
						}
					}
				}
			}
		}
	}
	// Each probe's JSON says which content seed it drew from.
	seeds := map[any]bool{}
	for _, s := range res["sides"].([]any) {
		for _, p := range s.(map[string]any)["probes"].([]any) {
			seeds[p.(map[string]any)["content_seed"]] = true
		}
	}
	if len(seeds) != 3 {
		t.Errorf("content seeds of the probes: %v, want 3 distinct", seeds)
	}
}

// The report shows each side's prefix hit ratio on every probe, in the
// Markdown and the JSON, as the server reported it: with --same-prompts
// every probe after the first replays the first and hits its whole
// prompts but the last partial block; with fresh prompts only the shared
// prefix hits.
func TestCompareReportsHitRatio(t *testing.T) {
	for _, tt := range []struct {
		name  string
		args  []string
		check func(rate, ratio float64) bool
		want  string
	}{
		{"fresh", []string{"--random-prefix-len", "32"}, func(rate, r float64) bool { return r <= 32.0/96+1e-9 }, "at most the shared prefix's share (32 of 96 tokens)"},
		{"same prompts", []string{"--same-prompts"}, func(rate, r float64) bool { return rate == 40 && r < 0.05 || rate > 40 && r > 0.7 }, "near 0 at 40 req/s and over 70% after"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, md, res := compareOnCaches(t, tt.args...)
			if !strings.Contains(md, "| Prefix hit ratio by probe") || !strings.Contains(md, "| Prefix hit ratio |") {
				t.Fatalf("the report omits the prefix hit ratio:\n%s", md)
			}
			for _, s := range res["sides"].([]any) {
				side := s.(map[string]any)
				hits := side["prefix_hit_ratio_by_probe"].([]any)
				if len(hits) != 3 {
					t.Fatalf("%s: hit ratio of %d probes, want 3", side["name"], len(hits))
				}
				var cells []string
				for _, h := range hits {
					h := h.(map[string]any)
					rate, ok1 := h["rate"].(float64)
					r, ok2 := h["prefix_hit_ratio"].(float64)
					if !ok1 || !ok2 || !tt.check(rate, r) {
						t.Errorf("%s: probe %v: hit ratio %v, want %s", side["name"], h["rate"], h["prefix_hit_ratio"], tt.want)
					}
					cells = append(cells, fmt.Sprintf("%.3g: %.1f%%", rate, 100*r))
				}
				// The Markdown row shows the same figures.
				if !strings.Contains(md, strings.Join(cells, ", ")) {
					t.Errorf("%s: the Markdown lacks the hit ratios %q:\n%s", side["name"], strings.Join(cells, ", "), md)
				}
				for _, p := range side["probes"].([]any) {
					if _, ok := p.(map[string]any)["prefix_hit_ratio"].(float64); !ok {
						t.Errorf("%s: a probe's JSON lacks prefix_hit_ratio", side["name"])
					}
				}
			}
		})
	}
}
