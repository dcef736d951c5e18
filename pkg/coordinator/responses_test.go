package coordinator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinator"
)

// postAs posts body to url with bearer and returns the status and body.
func postAs(ctx context.Context, t *testing.T, url, bearer string, body any) (int, []byte) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// TestResponsesAgentLoop runs a two-turn agent loop through the Responses
// API of a standalone stack (the ref engine's random weights, the
// embedded NATS server's JetStream keeping the responses): a forced tool
// call, its output sent back with previous_response_id, the second turn
// reusing the first turn's KV (cached_tokens); another API key can
// neither read nor continue the conversation. It fails when the
// embedded server has no JetStream (nothing is stored: the continuation
// is a 404) or when the coordinator's NATS permissions lack the bucket.
func TestResponsesAgentLoop(t *testing.T) {
	checkNoLeaks(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "api-keys")
	writeAuthFile(t, keys, hashKey(t, authKeyA, "--name", "team-a")+hashKey(t, authKeyB, "--name", "team-b"))
	cl := startCluster(t, clusterOpts{mode: coordinator.ModeColocated, edit: func(o *coordinator.Options) { o.Auth.APIKeysFile = keys }})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tools := []any{map[string]any{"type": "function", "name": "flag", "parameters": json.RawMessage(`{"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}`)}}
	code, body := postAs(ctx, t, cl.url+"/v1/responses", authKeyA, map[string]any{
		"input": "go", "tools": tools, "tool_choice": "required", "parallel_tool_calls": false, "temperature": 0, "max_output_tokens": 120,
	})
	if code != 200 {
		t.Fatalf("turn 1: %d %s", code, body)
	}
	var raw1 map[string]any
	_ = json.Unmarshal(body, &raw1)
	out1, _ := raw1["output"].([]any)
	if len(out1) != 1 || raw1["status"] != "completed" {
		t.Fatalf("turn 1: want one function_call: %s", body)
	}
	call := out1[0].(map[string]any)
	var args map[string]any
	if call["type"] != "function_call" || call["name"] != "flag" || json.Unmarshal([]byte(call["arguments"].(string)), &args) != nil {
		t.Fatalf("turn 1: not a valid call: %v", call)
	}
	id := raw1["id"].(string)

	// Another key: no read, no continuation.
	if code, b := httpGet(t, cl.url+"/v1/responses/"+id, authKeyB); code != 404 || strings.Contains(b, "flag") {
		t.Errorf("GET by another key: %d %s", code, b)
	}
	next := map[string]any{"previous_response_id": id, "input": []any{map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}},
		"tools": tools, "tool_choice": "auto", "temperature": 0, "max_output_tokens": 8, "stream": true}
	if code, b := postAs(ctx, t, cl.url+"/v1/responses", authKeyB, next); code != 404 {
		t.Errorf("continuation by another key: %d %s", code, b)
	}

	// The owner continues, streamed; the prompt's prefix is the first
	// turn's, whose KV the worker holds.
	code, body = postAs(ctx, t, cl.url+"/v1/responses", authKeyA, next)
	if code != 200 {
		t.Fatalf("turn 2: %d %s", code, body)
	}
	var last map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev map[string]any
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			if ev["sequence_number"] != float64(n) {
				t.Errorf("event %d: sequence_number %v", n, ev["sequence_number"])
			}
			n++
			last = ev
		}
	}
	if last == nil || (last["type"] != "response.completed" && last["type"] != "response.incomplete") {
		t.Fatalf("turn 2's last event: %v", last)
	}
	r2 := last["response"].(map[string]any)
	if r2["previous_response_id"] != id {
		t.Errorf("previous_response_id %v", r2["previous_response_id"])
	}
	u := r2["usage"].(map[string]any)
	cached := u["input_tokens_details"].(map[string]any)["cached_tokens"].(float64)
	if cached <= 0 || cached > u["input_tokens"].(float64) {
		t.Errorf("turn 2 cached_tokens %v of %v input tokens: want the first turn's prefix reused", cached, u["input_tokens"])
	}
	if code, b := httpGet(t, cl.url+"/v1/responses/"+r2["id"].(string), authKeyA); code != 200 || !strings.Contains(b, id) {
		t.Errorf("GET turn 2: %d %s", code, b)
	}
}

// TestResponsesContinuationRoutesToPrefix: with two colocated workers, a
// continuation by previous_response_id is routed to the worker that ran
// the previous turn and starts from its cached KV: the previous turn's
// prompt, rendered again as the start of the longer conversation, is the
// new prompt's prefix to the last full block (turn 1's output is not in
// the cache: a worker keeps a finished request's prompt blocks). It fails
// when the continuation's prompt does not start with the previous turn's
// tokens (the history rendered differently, or not at all: hit 0), or
// when the router sends the turn to the other worker.
func TestResponsesContinuationRoutesToPrefix(t *testing.T) {
	checkNoLeaks(t)
	cl := startCluster(t, clusterOpts{mode: coordinator.ModeColocated, decode: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tools := []any{map[string]any{"type": "function", "name": "step", "parameters": json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)}}
	const instructions = "You run a loop of tool calls, one per turn, until told to stop."
	turn := func(body map[string]any) (resp map[string]any, pd map[string]any) {
		t.Helper()
		body["tools"], body["tool_choice"], body["parallel_tool_calls"], body["instructions"] = tools, "required", false, instructions
		body["temperature"], body["max_output_tokens"] = 0, 120
		code, b := postAs(ctx, t, cl.url+"/v1/responses", "", body)
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		if err := json.Unmarshal(b, &resp); err != nil {
			t.Fatal(err)
		}
		out, _ := resp["output"].([]any)
		if len(out) != 1 || out[0].(map[string]any)["type"] != "function_call" {
			t.Fatalf("want one function_call: %s", b)
		}
		pd, _ = resp["pdserve"].(map[string]any)
		if pd == nil {
			t.Fatalf("no pdserve budget: %s", b)
		}
		return resp, pd
	}
	prev, pd := turn(map[string]any{"input": "count"})
	for i := 2; i <= 3; i++ {
		in := int(prev["usage"].(map[string]any)["input_tokens"].(float64))
		worker, _ := pd["decode_worker"].(string)
		full := in / 16 * 16 // the previous prompt's full blocks of 16 tokens
		// The router learns the worker's cache from its KV events: wait
		// until they are indexed, so that the route is not left to chance.
		waitFor(t, 10*time.Second, func() error {
			if v := cl.c.KVIndex().Blocks(worker); v == nil || v.State().Blocks < full/16 {
				return fmt.Errorf("%s's cache of turn %d is not indexed", worker, i-1)
			}
			return nil
		})
		call := prev["output"].([]any)[0].(map[string]any)
		var npd map[string]any
		prev, npd = turn(map[string]any{"previous_response_id": prev["id"],
			"input": []any{map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": fmt.Sprintf("step %d done", i-1)}}})
		hit, _ := npd["prefix_hit_tokens"].(float64)
		if int(hit) < full {
			t.Errorf("turn %d: prefix hit %v tokens, want turn %d's %d-token prompt to its last full block (%d)", i, hit, i-1, in, full)
		}
		if npd["decode_worker"] != worker || npd["peer_prefix_hit_tokens"] != nil {
			t.Errorf("turn %d ran on %v (pulled %v tokens from a peer), want %s, which holds turn %d", i, npd["decode_worker"], npd["peer_prefix_hit_tokens"], worker, i-1)
		}
		pd = npd
	}
}
