package coordinator_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// llamaEngine returns engine settings for a random-weight llama model over
// the Llama-2 SPM vocabulary (random weights: the text is gibberish, its
// tokens exact), written into the test's temp dir.
func llamaEngine(t *testing.T) enginecfg.Options {
	t.Helper()
	lib, vocab := repotest.Llama(t)
	path := filepath.Join(t.TempDir(), "tiny-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 1024, Type: gguf.F32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	o := enginecfg.DefaultOptions()
	o.Engine, o.Model, o.LlamaLib, o.CtxSize, o.MaxSeqs, o.Threads = enginecfg.Llama, path, lib, 1024, 8, 1
	return o
}

// chunkTexts reads an event stream and returns each chunk's text (of the
// first choice, completion or chat) and the token ids of all chunks.
func chunkTexts(t *testing.T, body io.Reader) (texts []string, ids []int32) {
	t.Helper()
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				TokenIDs []int32 `json:"token_ids"`
			} `json:"choices"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if ch.Error != nil {
			t.Fatalf("error event: %s", data)
		}
		for _, c := range ch.Choices {
			texts = append(texts, c.Text+c.Delta.Content)
			ids = append(ids, c.TokenIDs...)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return texts, ids
}

type llamaOutput struct {
	Text   string
	Tokens []int32
}

// llamaRequests sends the same greedy completion and chat, streamed and
// not, and returns what each gave; streamed chunks are checked to be whole
// UTF-8 and to add up to the unstreamed text.
func llamaRequests(t *testing.T, url string) map[string]llamaOutput {
	t.Helper()
	ctx := context.Background()
	prompt := "Grüße aus Köln, 世界 ✓ — the quick brown fox"
	out := map[string]llamaOutput{}
	for _, ep := range []string{"completions", "chat/completions"} {
		body := map[string]any{"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true, "return_token_ids": true}
		if ep == "chat/completions" {
			delete(body, "prompt")
			body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
		}
		for _, stream := range []bool{false, true} {
			body["stream"] = stream
			resp := post(ctx, t, url+"/v1/"+ep, body)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("%s stream=%v: status %d: %s", ep, stream, resp.StatusCode, b)
			}
			var o llamaOutput
			if stream {
				texts, ids := chunkTexts(t, resp.Body)
				for i, s := range texts {
					if !utf8.ValidString(s) || strings.ContainsRune(s, utf8.RuneError) {
						t.Errorf("%s: chunk %d %q is not whole UTF-8", ep, i, s)
					}
				}
				o = llamaOutput{Text: strings.Join(texts, ""), Tokens: ids}
			} else {
				var r struct {
					Choices []struct {
						Text    string `json:"text"`
						Message struct {
							Content string `json:"content"`
						} `json:"message"`
						TokenIDs []int32 `json:"token_ids"`
					} `json:"choices"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
					t.Fatal(err)
				}
				o = llamaOutput{Text: r.Choices[0].Text + r.Choices[0].Message.Content, Tokens: r.Choices[0].TokenIDs}
			}
			resp.Body.Close()
			if len(o.Tokens) != 24 {
				t.Errorf("%s stream=%v: %d tokens, want 24", ep, stream, len(o.Tokens))
			}
			out[fmt.Sprintf("%s stream=%v", ep, stream)] = o
		}
		if a, b := out[ep+" stream=false"], out[ep+" stream=true"]; !cmp.Equal(a, b) {
			t.Errorf("%s: streamed output differs from the whole response:\n%s", ep, cmp.Diff(a, b))
		}
	}
	return out
}

// TestLlamacppServes: the standalone coordinator serves a llama.cpp model
// (completions and chat, streamed and not) disaggregated and colocated,
// with the same greedy output in both modes, equal to llama.cpp's own
// single-sequence generation, and UTF-8 intact in every streamed chunk.
func TestLlamacppServes(t *testing.T) {
	eo := llamaEngine(t)
	m, err := llamacpp.LoadModel(eo.Model, llamacpp.LoadOptions{LibDir: eo.LlamaLib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := m.Tokenizer().Encode("Grüße aus Köln, 世界 ✓ — the quick brown fox")
	want, err := m.GenerateReference(ids, 24, 1024, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]llamaOutput
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			cl := startCluster(t, clusterOpts{mode: mode, edit: func(o *coordinator.Options) { o.Engine = eo }})
			out := llamaRequests(t, cl.url)
			if diff := cmp.Diff(want, out["completions stream=false"].Tokens); diff != "" {
				t.Errorf("completion tokens differ from llama.cpp's own generation (-llama.cpp +pdserve):\n%s", diff)
			}
			if got, want := out["completions stream=false"].Text, clientText(t, m.Tokenizer(), want); got != want {
				t.Errorf("completion text %q, want the tokens' text %q", got, want)
			}
			got = append(got, out)
		})
	}
	if len(got) == 2 {
		if diff := cmp.Diff(got[0], got[1]); diff != "" {
			t.Errorf("disaggregated and colocated outputs differ (-disaggregated +colocated):\n%s", diff)
		}
	}
}

// gatedLlama is a gated llama.cpp engine that still exports the engine's
// own metrics.
type gatedLlama struct {
	*gatedEngine
	e *llamacpp.Engine
}

func (g gatedLlama) Collector() prometheus.Collector { return g.e.Collector() }

// TestLlamacppDisconnectFreesKV: a client that disconnects mid-stream frees
// the sequence on both workers: llama.cpp holds no cells and the engines no
// sequences afterwards, and a whole request after it leaves the same
// counts.
func TestLlamacppDisconnectFreesKV(t *testing.T) {
	eo := llamaEngine(t)
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			var g *gatedEngine
			cl := startCluster(t, clusterOpts{mode: mode, edit: func(o *coordinator.Options) { o.Engine = eo },
				worker: func(wo *workerrun.Options) {
					if wo.Role == control.RolePrefill {
						return
					}
					e, err := enginebuild.Build(eo)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { enginebuild.Close(e) })
					g = newGated(e)
					wo.EngineOverride = gatedLlama{g, e.(*llamacpp.Engine)}
				}})
			cells := func() error {
				for _, w := range cl.c.Workers() {
					for _, name := range []string{"pdserve_engine_kv_cells_used", "pdserve_engine_sequences"} {
						if v, ok := gauge(t, cl.c.Registry(), name, w.ID()); !ok || v != 0 {
							return fmt.Errorf("worker %s: %s = %v (found %v), want 0", w.ID(), name, v, ok)
						}
					}
				}
				return cl.idle(t)
			}
			g.allow(3)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, toks := openStream(ctx, t, cl.url, request{Prompt: "cancel me please, 世界", MaxTokens: 200, IgnoreEOS: true}, 2)
			defer resp.Body.Close()
			if len(toks) >= 200 {
				t.Fatalf("request finished before the disconnect")
			}
			if err := cells(); err == nil {
				t.Fatalf("no KV held while a request is in flight")
			}
			cancel()
			g.open()
			waitFor(t, 20*time.Second, cells)
			// A whole request afterwards leaves the same counts.
			complete(context.Background(), t, cl.url, request{Prompt: "and now in full", MaxTokens: 8, IgnoreEOS: true})
			waitFor(t, 20*time.Second, cells)
		})
	}
}
