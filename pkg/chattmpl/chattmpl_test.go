package chattmpl

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/grammar"
)

var weatherTool = Tool{
	Name:       "get_weather",
	Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}`),
	Raw:        json.RawMessage(`{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}}}`),
}

var timeTool = Tool{
	Name:       "get_time",
	Parameters: json.RawMessage(`{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}`),
	Raw:        json.RawMessage(`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}}}`),
}

// roundTrip is a conversation with a tool call and its result.
var roundTrip = []Message{
	{Role: "user", Content: "Weather in Paris?"},
	{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
	{Role: "tool", ToolCallID: "call_1", Content: "sunny, 21"},
}

// bundled returns the chat templates of the vocab GGUFs of the llama.cpp
// bundle named, by file name. Without the bundle the test fails when CI=true
// and is skipped otherwise.
func bundled(t *testing.T, names ...string) map[string]string {
	t.Helper()
	dir, err := gguf.VocabDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: the vocab GGUFs are required)", err)
		}
		t.Skipf("%v: run make llama", err)
	}
	out := map[string]string{}
	for _, name := range names {
		f := filepath.Join(dir, name)
		g, err := gguf.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if src, err := gguf.Lookup[string](g.Metadata, "tokenizer.chat_template"); err == nil {
			out[filepath.Base(f)] = src
		}
	}
	return out
}

func testdataTemplate(t *testing.T, name string) *Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := Compile(string(src), "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// TestBundledTemplates renders every chat template of the bundle's vocab
// GGUFs: a plain chat, and (where the format is known) the tool round
// trip, whose call and result must reach the prompt.
func TestBundledTemplates(t *testing.T) {
	// The vocab GGUFs of the bundle that carry a chat template.
	want := map[string]Format{
		"ggml-vocab-qwen2.gguf": FormatHermes, "ggml-vocab-qwen35.gguf": FormatHermes,
		"ggml-vocab-phi-3.gguf": FormatHermes, "ggml-vocab-command-r.gguf": FormatHermes,
		"ggml-vocab-gemma-4.gguf": FormatUnknown,
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	tmpls := bundled(t, names...)
	for name, f := range want {
		src, ok := tmpls[name]
		if !ok {
			t.Errorf("%s: no chat template in the bundle", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			tm, err := Compile(src, "<s>", "</s>")
			if err != nil {
				t.Fatal(err)
			}
			if tm.Format() != f {
				t.Errorf("format %v, want %v", tm.Format(), f)
			}
			plain, err := tm.Render([]Message{{Role: "user", Content: "Hi there"}}, nil, true)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plain, "Hi there") {
				t.Errorf("plain chat lacks the user's text:\n%s", plain)
			}
			withTools, err := tm.Render(roundTrip, []Tool{weatherTool}, true)
			if f == FormatUnknown {
				if !errors.Is(err, ErrUnknownFormat) {
					t.Errorf("tools on an unknown format: %v, want ErrUnknownFormat", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"", `<tool_call>` + "\n" + `{"name": "get_weather", "arguments": {"city": "Paris"}}`, "<tool_response>\nsunny, 21\n</tool_response>"} {
				if !strings.Contains(withTools, s) {
					t.Errorf("rendered tools lack %q:\n%s", s, withTools)
				}
			}
		})
	}
}

// TestToolAwareTemplates renders the tool round trip through templates
// that render tools themselves: Qwen3's (Hermes) and Llama 3.2's (JSON).
func TestToolAwareTemplates(t *testing.T) {
	for _, tc := range []struct {
		file   string
		format Format
		thinks bool
		want   []string
	}{
		{"qwen3.jinja", FormatHermes, true, []string{
			`{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city"`,
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			"<tool_response>\nsunny, 21\n</tool_response>",
			"<|im_start|>assistant\n",
		}},
		{"llama3.2.jinja", FormatLlama3, false, []string{
			`"name": "get_weather"`,
			`{"name": "get_weather", "parameters": {"city": "Paris"}}`,
			"<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny, 21\"",
			"<|start_header_id|>assistant<|end_header_id|>\n\n",
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tm := testdataTemplate(t, tc.file)
			if tm.Format() != tc.format || tm.Thinks() != tc.thinks {
				t.Errorf("format %v thinks %v, want %v %v", tm.Format(), tm.Thinks(), tc.format, tc.thinks)
			}
			out, err := tm.Render(roundTrip, []Tool{weatherTool}, true)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.want {
				if !strings.Contains(out, s) {
					t.Errorf("lacks %q:\n%s", s, out)
				}
			}
			if !strings.HasSuffix(out, tc.want[len(tc.want)-1]) {
				t.Errorf("does not end opening the reply:\n%s", out)
			}
		})
	}
}

// pushAll feeds text to a parser in pieces of n bytes and flushes.
func pushAll(p *Parser, text string, n int) Delta {
	var d Delta
	for i := 0; i < len(text); i += n {
		d.add(p.Push(text[i:min(i+n, len(text))]))
	}
	d.add(p.Flush())
	return d
}

func TestParser(t *testing.T) {
	for _, tc := range []struct {
		name    string
		format  Format
		tools   bool
		inThink bool
		text    string
		want    Delta
	}{
		{"plain", FormatHermes, true, false, "Hello <b>world</b>", Delta{Content: "Hello <b>world</b>"}},
		{"hermes call", FormatHermes, true, false, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			Delta{Content: "Let me check.\n", Calls: []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
		{"hermes parallel", FormatHermes, true, false, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n",
			Delta{Calls: []ToolCall{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"x":[1,2]}`}}}},
		{"hermes unterminated at the end", FormatHermes, true, false, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}}",
			Delta{Calls: []ToolCall{{Name: "a", Arguments: `{"k":"v"}`}}}},
		{"hermes broken call is content", FormatHermes, true, false, "<tool_call>{oops}</tool_call> done",
			Delta{Content: "<tool_call>{oops}</tool_call> done"}},
		{"tools off: markup is content", FormatHermes, false, false, "<tool_call>{\"name\": \"a\"}</tool_call>",
			Delta{Content: "<tool_call>{\"name\": \"a\"}</tool_call>"}},
		{"reasoning", FormatHermes, false, false, "<think>\nLet me think.\n</think>\n\nParis.",
			Delta{Reasoning: "\nLet me think.\n", Content: "\n\nParis."}},
		{"reasoning then call", FormatHermes, true, false, "<think>hmm</think>\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>",
			Delta{Reasoning: "hmm", Calls: []ToolCall{{Name: "a", Arguments: `{}`}}}},
		{"prompt opened think", FormatHermes, false, true, "step 1</think>Answer", Delta{Reasoning: "step 1", Content: "Answer"}},
		{"unterminated reasoning", FormatHermes, false, true, "still thinking", Delta{Reasoning: "still thinking"}},
		{"not think", FormatHermes, false, false, "<thin ice", Delta{Content: "<thin ice"}},
		{"llama3 call", FormatLlama3, true, false, `{"name": "get_weather", "parameters": {"city": "Paris"}}`,
			Delta{Calls: []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
		{"llama3 two calls", FormatLlama3, true, false, `{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"n": 1}}`,
			Delta{Calls: []ToolCall{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"n":1}`}}}},
		{"llama3 json that is no call", FormatLlama3, true, false, `{"answer": 42}`, Delta{Content: `{"answer": 42}`}},
		{"llama3 text", FormatLlama3, true, false, "It is sunny.", Delta{Content: "It is sunny."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{1, 3, len(tc.text)} {
				got := pushAll(NewParser(tc.format, tc.tools, tc.inThink), tc.text, n)
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("pieces of %d (-want +got):\n%s", n, diff)
				}
			}
		})
	}
}

// TestParserCut: a reply cut by its token limit inside a tool call hands
// the call out as far as it goes (Cut), not as content; Flush keeps it
// content.
func TestParserCut(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format Format
		text   string
		want   Delta
	}{
		{"name cut", FormatHermes, "<tool_call>\n{\"name\": \"get_weat",
			Delta{Cut: &ToolCall{}}},
		{"arguments cut", FormatHermes, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
			Delta{Content: "Sure.\n", Cut: &ToolCall{Name: "get_weather", Arguments: `{"city": "Par`}}},
		{"before the arguments", FormatHermes, "<tool_call>\n{\"name\": \"a\", ",
			Delta{Cut: &ToolCall{Name: "a"}}},
		{"whole call, close tag cut", FormatHermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_",
			Delta{Calls: []ToolCall{{Name: "a", Arguments: `{}`}}}},
		{"second call cut", FormatHermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"n\": [1,",
			Delta{Calls: []ToolCall{{Name: "a", Arguments: `{}`}}, Cut: &ToolCall{Name: "b", Arguments: `{"n": [1,`}}},
		{"text cut is text", FormatHermes, "It is sun", Delta{Content: "It is sun"}},
		{"llama3 cut", FormatLlama3, `{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": "y`,
			Delta{Calls: []ToolCall{{Name: "a", Arguments: `{}`}}, Cut: &ToolCall{Name: "b", Arguments: `{"x": "y`}}},
		{"llama3 broken json is content", FormatLlama3, `{"name" 1`, Delta{Content: `{"name" 1`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewParser(tc.format, true, false)
			got := p.Push(tc.text)
			got.add(p.Cut())
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Cut (-want +got):\n%s", diff)
			}
			if d := pushAll(NewParser(tc.format, true, false), tc.text, 1); d.Cut != nil {
				t.Errorf("Flush handed out a cut call: %+v", d.Cut)
			}
		})
	}
}

// TestParserHoldsOnlyMarkup: text that cannot be markup is handed out at
// once, a partial tag is held.
func TestParserHoldsOnlyMarkup(t *testing.T) {
	p := NewParser(FormatHermes, true, false)
	if d := p.Push("Hi <tool_"); d.Content != "Hi " {
		t.Errorf("content %q, want %q (the partial tag held)", d.Content, "Hi ")
	}
	if d := p.Push("x> there"); d.Content != "<tool_x> there" {
		t.Errorf("content %q, want the released text", d.Content)
	}
	p = NewParser(FormatHermes, false, false)
	if d := p.Push("<thi"); d.Content != "" {
		t.Errorf("a partial <think> was released: %q", d.Content)
	}
	if d := p.Push("nk>a</th"); d.Reasoning != "a" || d.Content != "" {
		t.Errorf("got %+v, want reasoning a", d)
	}
}

func TestOpensThink(t *testing.T) {
	if !OpensThink("<|Assistant|><think>\n") || OpensThink("<think>\n\n</think>\n\n") || OpensThink("hello") {
		t.Error("OpensThink misjudges")
	}
}

// TestGrammar: the grammar of required/named choices accepts exactly the
// calls of the offered tools whose arguments fit their schemas.
func TestGrammar(t *testing.T) {
	tools := []Tool{weatherTool, timeTool}
	all := []string{"get_weather", "get_time"}
	for _, tc := range []struct {
		name     string
		format   Format
		names    []string
		parallel bool
		text     string
		ok       bool
	}{
		{"hermes weather", FormatHermes, all, false, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>", true},
		{"hermes time", FormatHermes, all, false, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>", true},
		{"hermes wrong args", FormatHermes, all, false, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false},
		{"hermes named only", FormatHermes, []string{"get_time"}, false, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false},
		{"hermes two calls, parallel", FormatHermes, all, true, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>", true},
		{"hermes two calls, not parallel", FormatHermes, all, false, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>", false},
		{"hermes text", FormatHermes, all, false, "Sure!", false},
		{"llama3", FormatLlama3, all, true, `{"name": "get_weather", "parameters": {"city": "Oslo"}}`, true},
		{"llama3 hermes syntax", FormatLlama3, all, true, `{"name": "get_weather", "arguments": {"city": "Oslo"}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := Grammar(tc.format, tools, tc.names, tc.parallel)
			if err != nil {
				t.Fatal(err)
			}
			g, err := grammar.Parse(src, "root")
			if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			m, err := g.Matcher()
			if err != nil {
				t.Fatal(err)
			}
			got := m.Accept([]byte(tc.text)) == nil && m.Complete()
			if got != tc.ok {
				t.Errorf("accepted %v, want %v", got, tc.ok)
			}
			if tc.ok {
				d := pushAll(NewParser(tc.format, true, false), tc.text, 1)
				if len(d.Calls) == 0 || d.Content != "" {
					t.Errorf("a grammatical call does not parse as one: %+v", d)
				}
			}
		})
	}
	bad := Tool{Name: "bad", Parameters: json.RawMessage(`{"type":"string","pattern":"^(x$"}`)}
	_, err := Grammar(FormatHermes, []Tool{bad}, []string{"bad"}, false)
	var se *ToolSchemaError
	var ue *grammar.UnsupportedError
	if !errors.As(err, &se) || se.Tool != "bad" || !errors.As(err, &ue) || !strings.HasPrefix(ue.Keyword, "pattern") {
		t.Errorf("unsupported schema: %v, want a ToolSchemaError naming the tool and pattern", err)
	}
}

// TestGenericKeepsSystem: Generic appends the tools to the system message
// and folds consecutive tool results into one user turn.
func TestGenericKeepsSystem(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather and time?"},
		{Role: "assistant", Content: "", ToolCalls: []ToolCall{{ID: "a", Name: "get_weather", Arguments: `{"city":"Oslo"}`}, {ID: "b", Name: "get_time", Arguments: `{"zone":"CET"}`}}},
		{Role: "tool", ToolCallID: "a", Content: "rain"},
		{Role: "tool", ToolCallID: "b", Content: "12:00"},
	}
	out := Generic(msgs, []Tool{weatherTool, timeTool})
	if len(out) != 4 || out[0].Role != "system" || !strings.HasPrefix(out[0].Content, "Be brief.\n\n# Tools") {
		t.Fatalf("got %+v", out)
	}
	wantCall := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>"
	if out[2].Content != wantCall {
		t.Errorf("assistant turn %q, want %q", out[2].Content, wantCall)
	}
	if out[3].Role != "user" || out[3].Content != "<tool_response>\nrain\n</tool_response>\n<tool_response>\n12:00\n</tool_response>" {
		t.Errorf("tool turn %+v", out[3])
	}
	if !strings.Contains(out[0].Content, `{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city"`) {
		t.Errorf("tools not described in order:\n%s", out[0].Content)
	}
}

// TestAgentLoopKeepsPromptPrefix: in an agent loop (a user task, then
// tool calls and their results, each turn continuing the last), every
// turn's prompt starts with the previous turn's prompt, as rendered
// with the generation prompt, and then the previous turn's reply, so
// that a worker's cached KV of the previous prompt is the new prompt's
// prefix. Qwen3's keeps each turn's reasoning while no new user message
// comes. It fails for a template that renders a turn differently once
// more messages follow (a generation prompt that is not the start of the
// assistant turn, tools moved to the last user message, a dropped
// reasoning block).
func TestAgentLoopKeepsPromptPrefix(t *testing.T) {
	loop := func(k int, reasoning bool) []Message {
		msgs := []Message{{Role: "system", Content: "You are an agent."}, {Role: "user", Content: "Weather in three cities?"}}
		for i := range k {
			id := fmt.Sprintf("call_%d", i)
			a := Message{Role: "assistant", ToolCalls: []ToolCall{{ID: id, Name: "get_weather", Arguments: fmt.Sprintf(`{"city": "c%d"}`, i)}}}
			if reasoning {
				a.Reasoning = fmt.Sprintf("Next city %d.", i)
			}
			msgs = append(msgs, a, Message{Role: "tool", ToolCallID: id, Content: fmt.Sprintf("sunny, %d", 20+i)})
		}
		return msgs
	}
	// prefixKept returns how the prompts of a 4-turn loop leave the
	// previous turn's, nil when none does.
	prefixKept := func(tm *Template, reasoning bool) error {
		prev := ""
		for k := range 4 {
			out, err := tm.Render(loop(k, reasoning), []Tool{weatherTool}, true)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(out, prev) {
				n := 0
				for n < len(prev) && n < len(out) && prev[n] == out[n] {
					n++
				}
				return fmt.Errorf("turn %d's prompt leaves turn %d's at byte %d of %d:\nprevious: …%q\nnew:      …%q", k+1, k, n, len(prev), prev[max(0, n-40):], out[max(0, n-40):min(len(out), n+40)])
			}
			if k > 0 && !strings.Contains(out[len(prev):], fmt.Sprintf("c%d", k-1)) {
				return fmt.Errorf("turn %d: the previous turn's call does not follow the previous prompt: %q", k+1, out[len(prev):])
			}
			prev = out
		}
		return nil
	}
	check := func(t *testing.T, tm *Template, reasoning bool) {
		t.Helper()
		if err := prefixKept(tm, reasoning); err != nil {
			t.Error(err)
		}
	}
	// The check itself: a template whose generation prompt is not how it
	// renders the assistant's turn breaks the prefix.
	bad, err := Compile(`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<reply>{% endif %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if prefixKept(bad, false) == nil {
		t.Error("a template whose generation prompt differs from its assistant turn passes the check")
	}
	for _, file := range []string{"qwen3.jinja", "llama3.2.jinja"} {
		t.Run(file, func(t *testing.T) {
			tm := testdataTemplate(t, file)
			check(t, tm, tm.Thinks())
		})
	}
	t.Run("bundled", func(t *testing.T) {
		for name, src := range bundled(t, "ggml-vocab-qwen2.gguf", "ggml-vocab-qwen35.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-command-r.gguf") {
			t.Run(name, func(t *testing.T) {
				tm, err := Compile(src, "<s>", "</s>")
				if err != nil {
					t.Fatal(err)
				}
				check(t, tm, tm.Thinks())
			})
		}
	})
}
