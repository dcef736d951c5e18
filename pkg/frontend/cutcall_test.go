package frontend

import (
	"testing"
)

// chatWeatherTool is weatherTool as chat writes it.
const chatWeatherTool = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

// roomForTools lifts the test server's budgets so that tools' preamble
// fits.
func roomForTools(o *Options) {
	o.Policy.Budgets.Default, o.Policy.Budgets.Routes = 8000, nil
	o.Policy.Limits.MaxTokensCap = 0
	o.Models = func() []Model { return []Model{{Name: "tiny", MaxModelLen: 16384}} }
}

// TestToolCallCutByMaxTokens: a reply cut by max_tokens inside a tool
// call ends with finish_reason "length" and the call, as far as it goes,
// in tool_calls (its name when whole, its arguments as written), as
// OpenAI's does, streamed and not, on chat and on the Responses API.
// Fails on the old parser, which handed the cut call out as content.
func TestToolCallCutByMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, reply, wantName, wantArgs, wantContent string
	}{
		{"arguments cut", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", "get_weather", `{"city": "Par`, ""},
		{"name cut", "Let me see.\n<tool_call>\n{\"name\": \"get_weat", "", "", "Let me see.\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestServer(t, &fakeBackend{complete: echoText(tc.reply)}, roomForTools)
			body := `{"messages":[{"role":"user","content":"w?"}],"max_tokens":40,` + chatWeatherTool

			ch := choice0(t, decodeJSON(t, ts.post(t, RouteChat, body+`}`).Body))
			msg := ch["message"].(map[string]any)
			if ch["finish_reason"] != "length" {
				t.Errorf("finish_reason %v, want length", ch["finish_reason"])
			}
			calls := asSlice(msg["tool_calls"])
			if len(calls) != 1 {
				t.Fatalf("tool_calls %v, want the cut call (content %q)", msg["tool_calls"], msg["content"])
			}
			fn := calls[0].(map[string]any)["function"].(map[string]any)
			if name, ok := fn["name"]; !ok || name != tc.wantName || fn["arguments"] != tc.wantArgs {
				t.Errorf("function %v, want name %q arguments %q", fn, tc.wantName, tc.wantArgs)
			}
			if c, _ := msg["content"].(string); c != tc.wantContent {
				t.Errorf("content %q, want %q", c, tc.wantContent)
			}

			// Streamed: the call's head, then its arguments, finish "length".
			var name, args, finish string
			heads := 0
			for _, c := range streamed(t, ts.post(t, RouteChat, body+`,"stream":true}`)) {
				for _, x := range asSlice(c["choices"]) {
					cc := x.(map[string]any)
					if f, ok := cc["finish_reason"].(string); ok {
						finish = f
					}
					d, _ := cc["delta"].(map[string]any)
					for _, y := range asSlice(d["tool_calls"]) {
						tcl := y.(map[string]any)
						fn := tcl["function"].(map[string]any)
						if _, ok := tcl["id"]; ok {
							heads++
							if n, ok := fn["name"].(string); ok {
								name = n
							} else {
								t.Errorf("call head without a name: %v", tcl)
							}
						}
						a, _ := fn["arguments"].(string)
						args += a
					}
				}
			}
			if heads != 1 || name != tc.wantName || args != tc.wantArgs || finish != "length" {
				t.Errorf("stream: %d heads, name %q args %q finish %q; want 1, %q, %q, length", heads, name, args, finish, tc.wantName, tc.wantArgs)
			}

			// The Responses API: an incomplete function_call item.
			rbody := `{"input":"w?","max_output_tokens":40,` + weatherTool
			check := func(resp map[string]any) {
				t.Helper()
				if resp["status"] != "incomplete" {
					t.Errorf("response status %v, want incomplete", resp["status"])
				}
				if d, _ := resp["incomplete_details"].(map[string]any); d["reason"] != "max_output_tokens" {
					t.Errorf("incomplete_details %v", resp["incomplete_details"])
				}
				out := asSlice(resp["output"])
				if len(out) == 0 {
					t.Fatalf("no output")
				}
				it := out[len(out)-1].(map[string]any)
				if it["type"] != "function_call" || it["status"] != "incomplete" || it["name"] != tc.wantName || it["arguments"] != tc.wantArgs {
					t.Errorf("last item %v, want an incomplete function_call %q %q", it, tc.wantName, tc.wantArgs)
				}
			}
			check(respJSON(t, ts.post(t, RouteResponses, rbody+`}`).Body))
			evs := respEvents(t, ts.post(t, RouteResponses, rbody+`,"stream":true}`).Body)
			check(evs[len(evs)-1].data["response"].(map[string]any))
		})
	}
}
