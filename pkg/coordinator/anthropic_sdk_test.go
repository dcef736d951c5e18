package coordinator_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinator"
)

// anthropicSDK returns node and the installed Anthropic TypeScript SDK
// (make sdk), or skips the test where they are missing; under CI=true
// their absence fails it.
func anthropicSDK(t *testing.T) (node, sdk string) {
	t.Helper()
	sdk, err := filepath.Abs("../../third_party/anthropic-sdk/node_modules/@anthropic-ai/sdk")
	if err != nil {
		t.Fatal(err)
	}
	node, nerr := exec.LookPath("node")
	_, serr := os.Stat(filepath.Join(sdk, "package.json"))
	if nerr == nil && serr == nil {
		return node, sdk
	}
	msg := "the Anthropic SDK test needs node and `make sdk` (third_party/anthropic-sdk)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: node: %v; sdk: %v", msg, nerr, serr)
	}
	t.Skip(msg)
	return "", ""
}

// sdkMessage is a Message as testdata/anthropic_sdk.mjs prints it.
type sdkMessage struct {
	ID, Type, Role, Model, Stop_reason string
	Stop_sequence                      *string
	Usage                              struct {
		Input_tokens, Output_tokens, Cache_read_input_tokens *int
	}
	Blocks []struct {
		Type, ID, Name string
		Text           *string
		Input          json.RawMessage
	}
}

// check reports what is wrong with the shape of m: a stop reason in
// stops, blocks of Anthropic's types, usage counted.
func (m sdkMessage) check(stops ...string) []string {
	var bad []string
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "tiny" {
		bad = append(bad, "head")
	}
	if !slices.Contains(stops, m.Stop_reason) {
		bad = append(bad, "stop_reason "+m.Stop_reason)
	}
	u := m.Usage
	if u.Input_tokens == nil || *u.Input_tokens < 0 || u.Output_tokens == nil || *u.Output_tokens < 1 || u.Cache_read_input_tokens == nil {
		bad = append(bad, "usage")
	}
	for _, b := range m.Blocks {
		switch {
		case b.Type == "text" && b.Text != nil:
		case b.Type == "thinking":
		case b.Type == "tool_use" && strings.HasPrefix(b.ID, "toolu_") && b.Name != "" && strings.HasPrefix(string(b.Input), "{"):
		default:
			bad = append(bad, "block "+b.Type)
		}
	}
	return bad
}

// TestAnthropicSDK drives a disaggregated standalone server's Messages
// API with the official Anthropic TypeScript SDK, authenticated by
// x-api-key: messages.create, messages.stream (the SDK's MessageStream
// assembling the events), a tool-use round trip (a forced call with
// schema-valid input, its tool_result sent back; a streamed call built
// from input_json_delta) and the SDK's typed errors. Random weights:
// shapes are checked, not text.
func TestAnthropicSDK(t *testing.T) {
	node, sdk := anthropicSDK(t)
	keys := filepath.Join(t.TempDir(), "api-keys")
	writeAuthFile(t, keys, hashKey(t, authKeyA, "--name", "team-a"))
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.Auth.APIKeysFile = keys }})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/anthropic_sdk.mjs")
	cmd.Env = append(os.Environ(), "ANTHROPIC_SDK="+sdk, "ANTHROPIC_BASE_URL="+cl.url, "ANTHROPIC_API_KEY="+authKeyA, "PDSERVE_MODEL=tiny")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var out struct {
		Create sdkMessage
		Stream struct {
			sdkMessage
			Events []string
			Text   string
		}
		Tools struct {
			Call, Next, Streamed sdkMessage
			Partial              string
		}
		TopK, UnknownModel struct {
			Raised, Type, Message string
			Status                int
			BadRequest, NotFound  bool
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}

	if bad := out.Create.check("end_turn", "max_tokens"); len(bad) > 0 {
		t.Errorf("messages.create: %v in %+v", bad, out.Create)
	}
	st := out.Stream
	if bad := st.check("end_turn", "max_tokens"); len(bad) > 0 {
		t.Errorf("messages.stream: %v in %+v", bad, st.sdkMessage)
	}
	if len(st.Events) < 4 || st.Events[0] != "message_start" || st.Events[len(st.Events)-1] != "message_stop" || !slices.Contains(st.Events, "message_delta") {
		t.Errorf("stream events %v", st.Events)
	}
	var joined string
	for _, b := range st.Blocks {
		if b.Text != nil {
			joined += *b.Text
		}
	}
	if joined != st.Text {
		t.Errorf("the text events %q are not the final message's text %q", st.Text, joined)
	}

	tl := out.Tools
	if bad := tl.Call.check("tool_use", "max_tokens"); len(bad) > 0 {
		t.Errorf("forced tool call: %v in %+v", bad, tl.Call)
	}
	validInput := func(m sdkMessage) bool {
		for _, b := range m.Blocks {
			var in struct{ City string }
			if b.Type == "tool_use" && b.Name == "get_weather" && json.Unmarshal(b.Input, &in) == nil && (in.City == "Paris" || in.City == "Oslo") {
				return true
			}
		}
		return false
	}
	if tl.Call.Stop_reason != "tool_use" || !validInput(tl.Call) {
		t.Errorf("forced tool call %+v: want stop_reason tool_use and a get_weather input valid against its schema", tl.Call)
	}
	if bad := tl.Next.check("end_turn", "max_tokens", "tool_use"); len(bad) > 0 {
		t.Errorf("reply after the tool_result: %v in %+v", bad, tl.Next)
	}
	if tl.Streamed.Stop_reason != "tool_use" || !validInput(tl.Streamed) || tl.Partial == "" {
		t.Errorf("streamed tool call %+v (input deltas %q): want the SDK to build a valid input", tl.Streamed, tl.Partial)
	}

	if e := out.TopK; !e.BadRequest || e.Status != 400 || e.Type != "invalid_request_error" || !strings.Contains(e.Message, "top_k") {
		t.Errorf("top_k: %+v, want a BadRequestError naming top_k", e)
	}
	if e := out.UnknownModel; !e.NotFound || e.Status != 404 || e.Type != "not_found_error" {
		t.Errorf("unknown model: %+v, want a NotFoundError", e)
	}
}
