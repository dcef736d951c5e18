package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// TestToolChoiceRequiredOnRandomWeights: tool_choice "required" and a
// named function decode under the tools' call grammar, so the ref
// engine's random weights produce a call that parses, names an offered
// tool and whose arguments fit its schema, greedy and sampled.
func TestToolChoiceRequiredOnRandomWeights(t *testing.T) {
	checkNoLeaks(t)
	toolChoiceOnRandomWeights(t, startCluster(t, clusterOpts{}))
}

// TestLlamacppToolChoiceRequiredOnRandomWeights is
// TestToolChoiceRequiredOnRandomWeights on llama.cpp with a random-weight
// model over Qwen2's vocabulary, whose chat template the coordinator
// renders in Go Jinja and whose workers follow the call grammar with
// llama.cpp's grammar sampler.
func TestLlamacppToolChoiceRequiredOnRandomWeights(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	o, err := gguf.Shape("tiny-qwen2")
	if err != nil {
		t.Fatal(err)
	}
	o.Seed, o.Vocab = 3, filepath.Join(vocab, "ggml-vocab-qwen2.gguf")
	path := filepath.Join(t.TempDir(), "tiny-qwen2.gguf")
	if err := gguf.WriteRandom(path, o); err != nil {
		t.Fatal(err)
	}
	eo := enginecfg.DefaultOptions()
	eo.Engine, eo.Model, eo.LlamaLib, eo.CtxSize, eo.MaxSeqs, eo.Threads = enginecfg.Llama, path, lib, 1024, 4, 1
	checkNoLeaks(t)
	toolChoiceOnRandomWeights(t, startCluster(t, clusterOpts{edit: func(co *coordinator.Options) { co.Engine = eo }}))
}

func toolChoiceOnRandomWeights(t *testing.T, cl *cluster) {
	t.Helper()
	tools := []any{
		map[string]any{"type": "function", "function": map[string]any{"name": "pick", "parameters": json.RawMessage(`{"type":"object","properties":{"c":{"enum":["a","b"]},"ok":{"type":"boolean"}},"required":["c","ok"]}`)}},
		map[string]any{"type": "function", "function": map[string]any{"name": "flag", "parameters": json.RawMessage(`{"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}`)}},
	}
	for _, tc := range []struct {
		name   string
		choice any
		temp   float64
		want   []string // names allowed
	}{
		{"required greedy", "required", 0, []string{"pick", "flag"}},
		{"required sampled", "required", 1, []string{"pick", "flag"}},
		{"named sampled", map[string]any{"type": "function", "function": map[string]any{"name": "flag"}}, 1, []string{"flag"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp := post(ctx, t, cl.url+"/v1/chat/completions", map[string]any{
				"messages": []any{map[string]any{"role": "user", "content": "go"}}, "tools": tools, "tool_choice": tc.choice,
				"parallel_tool_calls": false, "temperature": tc.temp, "seed": 5, "max_tokens": 120,
			})
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var out struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
					Message      struct {
						Content   *string `json:"content"`
						ToolCalls []struct {
							ID       string `json:"id"`
							Function struct{ Name, Arguments string }
						} `json:"tool_calls"`
					} `json:"message"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) != 1 {
				t.Fatalf("body %s: %v", body, err)
			}
			c := out.Choices[0]
			if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.Content != nil {
				t.Fatalf("reply %s: want one tool call, content null, finish tool_calls", body)
			}
			call := c.Message.ToolCalls[0]
			if !slices.Contains(tc.want, call.Function.Name) {
				t.Errorf("called %q, want one of %v", call.Function.Name, tc.want)
			}
			var args map[string]any
			if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
				t.Fatalf("arguments %q: %v", call.Function.Arguments, err)
			}
			switch call.Function.Name {
			case "pick":
				if c, _ := args["c"].(string); (c != "a" && c != "b") || fmt.Sprintf("%T", args["ok"]) != "bool" || len(args) != 2 {
					t.Errorf("pick arguments %v do not fit the schema", args)
				}
			case "flag":
				if _, ok := args["on"].(bool); !ok || len(args) != 1 {
					t.Errorf("flag arguments %v do not fit the schema", args)
				}
			}
		})
	}
}
