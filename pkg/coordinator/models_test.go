package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/tokenizer"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// metaEngine changes what an engine tells about its model: the spec's
// MaxSeqLen when maxSeqLen > 0, and extra end-of-generation ids of its
// tokenizer.
type metaEngine struct {
	engine.Engine
	maxSeqLen int
	eog       []int32
}

func (e metaEngine) Spec() engine.ModelSpec {
	s := e.Engine.Spec()
	if e.maxSeqLen > 0 {
		s.MaxSeqLen = e.maxSeqLen
	}
	return s
}

func (e metaEngine) Tokenizer() engine.Tokenizer {
	return eogTokenizer{Tokenizer: e.Engine.Tokenizer(), extra: e.eog}
}

// eogTokenizer adds end-of-generation ids to a tokenizer.
type eogTokenizer struct {
	engine.Tokenizer
	extra []int32
}

func (t eogTokenizer) EOG() []int32 { return append([]int32{t.EOS()}, t.extra...) }

// newMetaEngine builds the tests' engine wrapped in a metaEngine, closed
// when the test ends (after the cluster, whose cleanup runs first).
func newMetaEngine(t *testing.T, maxSeqLen int, eog ...int32) metaEngine {
	t.Helper()
	e, err := enginebuild.Build(enginecfg.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { enginebuild.Close(e) })
	return metaEngine{Engine: e, maxSeqLen: maxSeqLen, eog: eog}
}

// renamedEngine serves an engine under another model name.
type renamedEngine struct {
	engine.Engine
	name string
}

func (e renamedEngine) Spec() engine.ModelSpec {
	s := e.Engine.Spec()
	s.Name = e.name
	return s
}

// newRenamedEngine builds the engine of o as model name, closed when the
// test ends (after the cluster, whose cleanup runs first).
func newRenamedEngine(t *testing.T, o enginecfg.Options, name string) renamedEngine {
	t.Helper()
	e, err := enginebuild.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { enginebuild.Close(e) })
	return renamedEngine{Engine: e, name: name}
}

// getModels returns the body of GET /v1/models.
func getModels(t *testing.T, url string) map[string]any {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/models: status %d, %v", resp.StatusCode, err)
	}
	return body
}

func modelList(models ...map[string]any) map[string]any {
	data := make([]any, len(models))
	for i, m := range models {
		data[i] = m
	}
	return map[string]any{"object": "list", "data": data}
}

// /v1/models reports each model's context length from the workers'
// heartbeats: the longest a decode worker takes, capped by the longest a
// prefill worker takes (here the one prefill worker's 512 of the tiny
// model's 1024).
func TestModelsReportMaxModelLen(t *testing.T) {
	short := newMetaEngine(t, 512)
	cl := startCluster(t, clusterOpts{worker: func(wo *workerrun.Options) {
		if wo.Role == control.RolePrefill {
			wo.EngineOverride = short
		}
	}})
	lens := map[string]int{}
	for _, hb := range cl.c.Membership().All() {
		lens[hb.Role] = hb.MaxSeqLen
	}
	if diff := cmp.Diff(map[string]int{"prefill": 512, "decode": 1024}, lens); diff != "" {
		t.Errorf("heartbeats' max_seq_len by role (-want +got):\n%s", diff)
	}
	want := modelList(map[string]any{"id": "tiny", "object": "model", "created": 0.0, "owned_by": "pdserve", "max_model_len": 512.0})
	if diff := cmp.Diff(want, getModels(t, cl.url)); diff != "" {
		t.Errorf("/v1/models (-want +got):\n%s", diff)
	}
}

// Under --model-name with no worker yet the length is unknown: omitted.
func TestModelsWithoutWorkers(t *testing.T) {
	url := startWithoutWorkers(t, "served-name")
	want := modelList(map[string]any{"id": "served-name", "object": "model", "created": 0.0, "owned_by": "pdserve"})
	if diff := cmp.Diff(want, getModels(t, url)); diff != "" {
		t.Errorf("/v1/models (-want +got):\n%s", diff)
	}
}

// An end-of-generation id other than EOS (llama.cpp's EOT, <|im_end|>…)
// ends a request as EOS does, on the workers and for the client, unless
// ignore_eos.
func TestEOGTokensEndRequests(t *testing.T) {
	ref := newReference(t)
	p := promptIDs(prompts[1].prompt)
	full := ref.generate(t, p, 24, engine.Sampling{}, true)
	eos := tokenizer.Bytes{}.EOS()
	at := slices.IndexFunc(full[2:], func(id int32) bool { return id != eos })
	if at < 0 {
		t.Fatal("reference output is all EOS")
	}
	extra := full[2+at]
	cut := slices.IndexFunc(full, func(id int32) bool { return id == extra || id == eos })
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			cl := startCluster(t, clusterOpts{mode: mode, worker: func(wo *workerrun.Options) {
				wo.EngineOverride = newMetaEngine(t, 0, extra)
			}})
			got := complete(context.Background(), t, cl.url, request{Prompt: p, MaxTokens: 24, Stream: true})
			if diff := cmp.Diff(full[:cut], got.Tokens); diff != "" || got.Finish != "stop" {
				t.Errorf("finish %q, want stop; tokens (-want +got):\n%s", got.Finish, diff)
			}
			got = complete(context.Background(), t, cl.url, request{Prompt: p, MaxTokens: 24, IgnoreEOS: true})
			if diff := cmp.Diff(full, got.Tokens); diff != "" || got.Finish != "length" {
				t.Errorf("ignore_eos: finish %q, want length; tokens (-want +got):\n%s", got.Finish, diff)
			}
			waitFor(t, 5*time.Second, func() error { return cl.idle(t) })
		})
	}
}

// One coordinator serves two models ("tiny", and "tiny-b": tiny's shape
// with other weights, renamedEngine; one prefill and one decode worker
// each): each request is routed only to the workers of its model (the
// two models' outputs differ, so a request served by the other model's
// worker shows), and an unknown model gets a 404. (The "small" preset as
// the second model cost 15 s under -race to draw its weights three times.)
func TestTwoModelsRouteByModel(t *testing.T) {
	other := enginecfg.DefaultOptions()
	other.Seed, other.Threads = 7, testEngineThreads
	cl := startCluster(t, clusterOpts{prefill: 2, decode: 2, worker: func(wo *workerrun.Options) {
		if strings.HasSuffix(wo.ID, "-1") {
			wo.EngineOverride = newRenamedEngine(t, other, "tiny-b")
		}
	}})
	waitFor(t, 10*time.Second, func() error {
		if n := len(cl.c.Models()); n != 2 {
			return fmt.Errorf("%d models served, want 2", n)
		}
		return nil
	})
	prompt := []int32{5, 17, 99, 3, 42, 8, 61}
	want := map[string][]int32{
		"tiny":   newReference(t).generate(t, prompt, 6, engine.Sampling{}, true),
		"tiny-b": (&reference{eng: newRenamedEngine(t, other, "tiny-b")}).generate(t, prompt, 6, engine.Sampling{}, true),
	}
	if slices.Equal(want["tiny"], want["tiny-b"]) {
		t.Fatalf("tiny and tiny-b generate the same tokens %v: the test could not tell them apart", want["tiny"])
	}
	// A hang guard.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, model := range []string{"tiny", "tiny-b", "tiny", "tiny-b"} {
		res := complete(ctx, t, cl.url, request{Model: model, Prompt: prompt, MaxTokens: 6, IgnoreEOS: true})
		if diff := cmp.Diff(want[model], res.Tokens); diff != "" {
			t.Errorf("model %s: tokens (-%s alone +served):\n%s", model, model, diff)
		}
		suffix := map[string]string{"tiny": "-0", "tiny-b": "-1"}[model]
		for _, w := range []string{"prefill_worker", "decode_worker"} {
			if id, _ := res.Budget[w].(string); !strings.HasSuffix(id, suffix) {
				t.Errorf("model %s: %s %q, want the %s worker", model, w, id, model)
			}
		}
	}
	resp := post(ctx, t, cl.url+"/v1/completions", request{Model: "nope", Prompt: prompt, MaxTokens: 2})
	defer resp.Body.Close()
	var body struct {
		Error struct {
			Code  string `json:"code"`
			Param string `json:"param"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNotFound || body.Error.Code != "model_not_found" || body.Error.Param != "model" {
		t.Errorf("unknown model: status %d, error %+v; want 404 model_not_found on param model", resp.StatusCode, body.Error)
	}
}
