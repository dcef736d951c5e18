package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/pdserve/pdserve/pkg/chattmpl"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/sampling"
)

// Parameter bounds.
const (
	// maxN is the most choices (n) per prompt.
	maxN = 128
	// defaultTemperature applies to a request without "temperature", as
	// OpenAI's API defines it.
	defaultTemperature = 1
	// maxStops is the most stop strings a request may give (as OpenAI).
	maxStops = 4
	// maxLogprobs is the most top alternatives per token: OpenAI allows 5
	// on /v1/completions and 20 on chat; pdserve allows 20 on both, as
	// vLLM.
	maxLogprobs = sampling.MaxTopLogprobs
)

// completionParams and chatParams are the parameters each route knows:
// OpenAI's, plus the vLLM extensions pdserve implements (ignore_eos,
// return_token_ids) and, on chat, vLLM's echo (refused). Any other field
// is a 400 unknown_parameter, as OpenAI answers.
var (
	completionParams = paramSet("model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
		"max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
		"top_p", "user", "ignore_eos", "return_token_ids", "response_format")
	chatParams = paramSet("model", "messages", "audio", "frequency_penalty", "function_call", "functions",
		"logit_bias", "logprobs", "top_logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
		"n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "reasoning_effort",
		"response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
		"stream_options", "temperature", "tool_choice", "tools", "top_p", "user", "verbosity",
		"web_search_options", "echo", "ignore_eos", "return_token_ids")
	streamOptionParams = paramSet("include_usage")
)

func paramSet(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// completionBody is the JSON body of either route, every known parameter
// typed (json.RawMessage where the type depends on the value or the
// route). A nil pointer is an absent or null parameter.
type completionBody struct {
	Model               *string            `json:"model"`
	Prompt              promptJSON         `json:"prompt"`   // completions
	Messages            json.RawMessage    `json:"messages"` // chat
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"` // chat
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	N                   *int               `json:"n"`
	BestOf              *int               `json:"best_of"` // completions
	Seed                *int64             `json:"seed"`
	Stop                json.RawMessage    `json:"stop"`
	Stream              *bool              `json:"stream"`
	StreamOptions       json.RawMessage    `json:"stream_options"`
	Echo                *bool              `json:"echo"`
	Suffix              *string            `json:"suffix"`   // completions
	Logprobs            json.RawMessage    `json:"logprobs"` // integer (completions) or boolean (chat)
	TopLogprobs         *int               `json:"top_logprobs"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	User                *string            `json:"user"`
	SafetyIdentifier    *string            `json:"safety_identifier"`
	PromptCacheKey      *string            `json:"prompt_cache_key"`
	Metadata            map[string]string  `json:"metadata"`
	Store               *bool              `json:"store"`
	ServiceTier         *string            `json:"service_tier"`
	ResponseFormat      json.RawMessage    `json:"response_format"`
	Tools               []json.RawMessage  `json:"tools"`
	ToolChoice          json.RawMessage    `json:"tool_choice"`
	Functions           []json.RawMessage  `json:"functions"`
	FunctionCall        json.RawMessage    `json:"function_call"`
	ParallelToolCalls   *bool              `json:"parallel_tool_calls"`
	Modalities          []string           `json:"modalities"`
	Audio               json.RawMessage    `json:"audio"`
	Prediction          json.RawMessage    `json:"prediction"`
	WebSearchOptions    json.RawMessage    `json:"web_search_options"`
	ReasoningEffort     *string            `json:"reasoning_effort"`
	Verbosity           *string            `json:"verbosity"`
	IgnoreEOS           *bool              `json:"ignore_eos"`
	// ReturnTokenIDs adds the output token ids to each choice (vLLM's
	// return_token_ids extension).
	ReturnTokenIDs *bool `json:"return_token_ids"`
}

// params is a validated request body, before tokenization and the
// model's limits.
type params struct {
	chat  bool
	model string // "" for the default model
	// prompts are the completions prompts (one or more); chat has msgs.
	prompts []promptIn
	msgs    []chattmpl.Message
	// tools are chat's tools; toolChoice one of the choice* constants
	// (choiceNone without tools), toolName the named function's;
	// parallel is parallel_tool_calls (true when absent).
	tools      []chattmpl.Tool
	toolChoice string
	toolName   string
	parallel   bool
	// maxTokens is the asked max_tokens, 0 when absent; maxParam names
	// the parameter it came from.
	maxTokens int
	maxParam  string
	n         int
	sampling  sampling.Sampling // Seed valid only when seeded
	seeded    bool
	stops     []string
	stream    bool
	usage     bool // stream_options.include_usage
	// logprobs is the top alternatives asked per token, -1 for none.
	logprobs  int
	echo      bool
	ignoreEOS bool
	returnIDs bool
}

// promptIn is one completions prompt as given: text or token ids.
type promptIn struct {
	text  string
	ids   []int32
	isIDs bool
}

// skipJSON is a JSON value decoded to nothing.
type skipJSON struct{}

func (*skipJSON) UnmarshalJSON([]byte) error { return nil }

// parseBody decodes and validates a request body of the chat route or
// the completions route, its containers first checked against lim
// (scanBody). Errors name the parameter at fault; none holds internal
// text.
func parseBody(data []byte, chat bool, lim bodyLimits) (*params, *apiError) {
	// The field names alone (no copy of their values), which also
	// validates the JSON before scanBody reads it.
	var fields map[string]skipJSON
	if err := json.Unmarshal(data, &fields); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, badRequest("", "invalid_json", "We could not parse the JSON body of your request: invalid JSON at byte offset %d.", se.Offset)
		}
		return nil, badRequest("", "invalid_json", "The request body must be a JSON object.")
	}
	if fields == nil {
		return nil, badRequest("", "invalid_json", "The request body must be a JSON object.")
	}
	known := completionParams
	if chat {
		known = chatParams
	}
	if aerr := checkKnown(fields, known, ""); aerr != nil {
		return nil, aerr
	}
	if aerr := scanBody(data, lim); aerr != nil {
		return nil, aerr
	}
	var b completionBody
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, typeError(err)
	}
	return b.validate(chat)
}

// checkKnown returns the 400 of the first field (in name order) that is
// not in known; prefix is prepended to its name ("stream_options.").
func checkKnown[V any](fields map[string]V, known map[string]bool, prefix string) *apiError {
	var unknown []string
	for k := range fields {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	name := prefix + unknown[0]
	return badRequest(name, "unknown_parameter", "Unrecognized request argument supplied: %s", name)
}

// typeError maps a decoding error of a known parameter to a 400 in the
// API's terms ("max_tokens must be an integer", "metadata must be an
// object of strings"), naming the top-level parameter.
func typeError(err error) *apiError {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field == "" {
		return badRequest("", "invalid_json", "The request body must be a JSON object.")
	}
	name, _, _ := strings.Cut(te.Field, ".")
	want := typeName(te.Type, false)
	if ft, ok := bodyFieldType(name); ok && indirect(ft) != indirect(te.Type) {
		switch ft.Kind() { // te is about an element
		case reflect.Map:
			want = "an object of " + typeName(ft.Elem(), true)
		case reflect.Slice:
			want = "an array of " + typeName(ft.Elem(), true)
		}
	}
	return badRequest(name, "invalid_type", "%s must be %s", name, want)
}

// bodyFieldType returns the Go type of completionBody's field for a JSON
// name.
func bodyFieldType(name string) (reflect.Type, bool) {
	t := reflect.TypeFor[completionBody]()
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
			return indirect(f.Type), true
		}
	}
	return nil, false
}

func indirect(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// typeName names t as the API does: "an integer", or "integers" when
// plural.
func typeName(t reflect.Type, plural bool) string {
	one, many := "an object", "objects"
	switch indirect(t).Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		one, many = "an integer", "integers"
	case reflect.Float32, reflect.Float64:
		one, many = "a number", "numbers"
	case reflect.Bool:
		one, many = "a boolean", "booleans"
	case reflect.String:
		one, many = "a string", "strings"
	case reflect.Slice, reflect.Array:
		one, many = "an array", "arrays"
	}
	if plural {
		return many
	}
	return one
}

// validate checks every parameter and returns the request's params.
func (b *completionBody) validate(chat bool) (*params, *apiError) {
	p := &params{chat: chat, n: 1, logprobs: -1, toolChoice: choiceNone, parallel: true}
	if b.Model != nil {
		p.model = *b.Model
	}
	if aerr := b.checkUnsupported(chat); aerr != nil {
		return nil, aerr
	}
	if b.N != nil {
		if *b.N < 1 || *b.N > maxN {
			return nil, badRequest("n", "invalid_value", "n must be in 1..%d, got %d", maxN, *b.N)
		}
		p.n = *b.N
	}
	if b.BestOf != nil && *b.BestOf != p.n {
		return nil, unsupported("best_of", "best_of must equal n (%d) when given, got %d: pdserve returns every choice it samples", p.n, *b.BestOf)
	}
	if b.Stream != nil {
		p.stream = *b.Stream
	}
	if !isAbsent(b.StreamOptions) {
		if !p.stream {
			return nil, badRequest("stream_options", "invalid_value", "stream_options is only allowed with stream: true")
		}
		usage, aerr := streamOptions(b.StreamOptions)
		if aerr != nil {
			return nil, aerr
		}
		p.usage = usage
	}
	switch {
	case b.Temperature != nil && (*b.Temperature < 0 || *b.Temperature > 2):
		return nil, badRequest("temperature", "invalid_value", "temperature must be in [0, 2], got %v", *b.Temperature)
	case b.TopP != nil && (*b.TopP <= 0 || *b.TopP > 1):
		return nil, badRequest("top_p", "invalid_value", "top_p must be in (0, 1], got %v", *b.TopP)
	case b.PresencePenalty != nil && (*b.PresencePenalty < -2 || *b.PresencePenalty > 2):
		return nil, badRequest("presence_penalty", "invalid_value", "presence_penalty must be in [-2, 2], got %v", *b.PresencePenalty)
	case b.FrequencyPenalty != nil && (*b.FrequencyPenalty < -2 || *b.FrequencyPenalty > 2):
		return nil, badRequest("frequency_penalty", "invalid_value", "frequency_penalty must be in [-2, 2], got %v", *b.FrequencyPenalty)
	}
	// OpenAI's (and vLLM's) default temperature is 1: a request that
	// gives none samples.
	p.sampling.Temperature = defaultTemperature
	if b.Temperature != nil {
		p.sampling.Temperature = float32(*b.Temperature)
	}
	if b.TopP != nil {
		p.sampling.TopP = float32(*b.TopP)
	}
	var presence, frequency float32
	if b.PresencePenalty != nil {
		presence = float32(*b.PresencePenalty)
	}
	if b.FrequencyPenalty != nil {
		frequency = float32(*b.FrequencyPenalty)
	}
	if presence != 0 || frequency != 0 {
		p.sampling.Penalties = &sampling.Penalties{Presence: presence, Frequency: frequency}
	}
	if b.Seed != nil {
		p.sampling.Seed, p.seeded = uint64(*b.Seed), true
	}
	if aerr := b.logprobs(p); aerr != nil {
		return nil, aerr
	}
	var aerr *apiError
	if p.sampling.Grammar, aerr = responseFormat(b.ResponseFormat); aerr != nil {
		return nil, aerr
	}
	if aerr := b.maxTokens(p); aerr != nil {
		return nil, aerr
	}
	stops, aerr := b.stops()
	if aerr != nil {
		return nil, aerr
	}
	p.stops = stops
	if b.Echo != nil {
		p.echo = *b.Echo
	}
	if b.IgnoreEOS != nil {
		p.ignoreEOS = *b.IgnoreEOS
	}
	if b.ReturnTokenIDs != nil {
		p.returnIDs = *b.ReturnTokenIDs
	}
	switch {
	case chat:
		p.msgs, aerr = chatMessages(b.Messages)
		if aerr == nil {
			aerr = b.toolParams(p)
		}
	case !b.Prompt.present:
		aerr = badRequest("prompt", "missing_prompt", "prompt is required")
	default:
		p.prompts, aerr = b.Prompt.prompts, b.Prompt.err
	}
	if aerr != nil {
		return nil, aerr
	}
	return p, nil
}

// toolParams sets p's tools, tool_choice and parallel_tool_calls.
// tool_choice "required" or a named function is decoded under a grammar
// of the call (server.go, toolGrammar), which replaces a JSON
// response_format's: as with OpenAI, the format governs the reply's text,
// and a forced call has none (the format's schema was still checked).
// Agent frameworks send both: the output type's schema on every turn,
// a forced tool choice on the first.
func (b *completionBody) toolParams(p *params) *apiError {
	var aerr *apiError
	if p.tools, aerr = toolsOf(b.Tools); aerr != nil {
		return aerr
	}
	if p.toolChoice, p.toolName, aerr = toolChoice(b.ToolChoice, p.tools); aerr != nil {
		return aerr
	}
	if b.ParallelToolCalls != nil {
		p.parallel = *b.ParallelToolCalls
	}
	if p.toolChoice == choiceRequired || p.toolChoice == choiceFunction {
		p.sampling.Grammar = ""
	}
	return nil
}

// checkUnsupported refuses the parameters pdserve does not implement
// with the value given. user, safety_identifier, prompt_cache_key and
// metadata are accepted and have no effect on the output (the router's
// prefix-cache routing needs no key); store is accepted when false (no
// completion is stored) and service_tier when "auto" or "default" (there
// is one tier); parallel_tool_calls is accepted either way since no tool
// is read with tools (toolParams).
func (b *completionBody) checkUnsupported(chat bool) *apiError {
	switch {
	case chat && b.Echo != nil && *b.Echo:
		return unsupported("echo", "echo is not supported on %s", RouteChat)
	case b.Suffix != nil && *b.Suffix != "":
		return unsupported("suffix", "suffix is not supported")
	case len(b.LogitBias) > 0:
		return unsupported("logit_bias", "logit_bias is not supported")
	case len(b.Functions) > 0:
		return unsupported("functions", "functions (deprecated) are not supported: give tools")
	case !noneChoice(b.FunctionCall):
		return unsupported("function_call", `function_call (deprecated) must be "none" or "auto": give tool_choice`)
	case b.Store != nil && *b.Store:
		return unsupported("store", "store is not supported: pdserve stores no completions")
	case b.ServiceTier != nil && *b.ServiceTier != "auto" && *b.ServiceTier != "default":
		return unsupported("service_tier", `service_tier must be "auto" or "default", got %q`, *b.ServiceTier)
	case b.Modalities != nil && !slices.Equal(b.Modalities, []string{"text"}):
		return unsupported("modalities", `modalities must be ["text"]`)
	case !isAbsent(b.Audio):
		return unsupported("audio", "audio output is not supported")
	case !isAbsent(b.Prediction):
		return unsupported("prediction", "predicted outputs are not supported")
	case !isAbsent(b.WebSearchOptions):
		return unsupported("web_search_options", "web search is not supported")
	case b.ReasoningEffort != nil:
		return unsupported("reasoning_effort", "reasoning_effort is not supported")
	case b.Verbosity != nil:
		return unsupported("verbosity", "verbosity is not supported")
	}
	return nil
}

// noneChoice reports whether a function_call asks for no call: absent,
// "none", or "auto" (there is no function to call).
func noneChoice(raw json.RawMessage) bool {
	if isAbsent(raw) {
		return true
	}
	var s string
	return json.Unmarshal(raw, &s) == nil && (s == "none" || s == "auto")
}

// responseFormat returns the grammar of a response_format: "" for an
// absent one or {"type": "text"}, grammar.JSONObject for {"type":
// "json_object"}, and the schema's grammar for {"type": "json_schema",
// "json_schema": {"name", "schema", "strict"}} (no schema: any JSON
// value). Decoding under the grammar keeps the output a prefix of a valid
// document; one cut by max_tokens ends with finish_reason "length", as
// OpenAI's does. Schema keywords grammar.FromSchema does not support are
// refused by name.
func responseFormat(raw json.RawMessage) (string, *apiError) {
	if isAbsent(raw) {
		return "", nil
	}
	var rf map[string]json.RawMessage
	if err := json.Unmarshal(raw, &rf); err != nil || rf == nil {
		return "", badRequest("response_format", "invalid_type", "response_format must be an object")
	}
	var typ string
	if err := json.Unmarshal(rf["type"], &typ); err != nil {
		return "", badRequest("response_format.type", "invalid_type", "response_format.type must be a string")
	}
	switch typ {
	case "text":
		return "", nil
	case "json_object":
		return grammar.JSONObject, nil
	case "json_schema":
	default:
		return "", badRequest("response_format.type", "invalid_value", `response_format.type must be "text", "json_object" or "json_schema", got %q`, typ)
	}
	var js struct {
		Name   *string         `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	}
	if err := json.Unmarshal(rf["json_schema"], &js); err != nil || isAbsent(rf["json_schema"]) {
		return "", badRequest("response_format.json_schema", "invalid_type", "response_format.json_schema must be an object with name, schema and strict")
	}
	if js.Name == nil || !validSchemaName(*js.Name) {
		return "", badRequest("response_format.json_schema.name", "invalid_value", "response_format.json_schema.name must be 1 to 64 letters, digits, _ or -")
	}
	schema := js.Schema
	if isAbsent(schema) {
		schema = json.RawMessage(`{}`)
	}
	g, err := grammar.FromSchema(schema)
	var u *grammar.UnsupportedError
	var le *grammar.LimitError
	switch {
	case errors.As(err, &u):
		return "", unsupported("response_format", "response_format.json_schema.schema: keyword %s at %q is not supported", u.Keyword, "#"+u.Path)
	case errors.As(err, &le):
		return "", schemaLimit("response_format.json_schema.schema", "response_format.json_schema.schema", le)
	case err != nil:
		return "", badRequest("response_format.json_schema.schema", "invalid_value", "response_format.json_schema.schema must be a JSON Schema object")
	}
	return g, nil
}

// schemaLimit is the 400 of a schema (or the grammar it makes) over one
// of pkg/grammar's limits, naming it: a permanent refusal, so no
// Retry-After. what names the schema in the message.
func schemaLimit(param, what string, le *grammar.LimitError) *apiError {
	return badRequest(param, "schema_too_large", "%s: over the limit of %d %s at %q", what, le.Max, le.Limit, "#"+le.Path)
}

// validSchemaName reports whether name is OpenAI's json_schema name:
// 1 to 64 of a-z, A-Z, 0-9, _ and -.
func validSchemaName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// streamOptions returns stream_options.include_usage.
func streamOptions(raw json.RawMessage) (bool, *apiError) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return false, badRequest("stream_options", "invalid_type", "stream_options must be an object")
	}
	if aerr := checkKnown(fields, streamOptionParams, "stream_options."); aerr != nil {
		return false, aerr
	}
	var usage *bool
	if raw := fields["include_usage"]; !isAbsent(raw) {
		if err := json.Unmarshal(raw, &usage); err != nil {
			return false, badRequest("stream_options.include_usage", "invalid_type", "stream_options.include_usage must be a boolean")
		}
	}
	return usage != nil && *usage, nil
}

// logprobs sets p.logprobs: completions' integer logprobs, or chat's
// logprobs boolean with top_logprobs.
func (b *completionBody) logprobs(p *params) *apiError {
	if !p.chat {
		if isAbsent(b.Logprobs) {
			return nil
		}
		var n int
		if err := json.Unmarshal(b.Logprobs, &n); err != nil {
			return badRequest("logprobs", "invalid_type", "logprobs must be an integer")
		}
		if n < 0 || n > maxLogprobs {
			return badRequest("logprobs", "invalid_value", "logprobs must be in 0..%d, got %d", maxLogprobs, n)
		}
		p.logprobs = n
		return nil
	}
	on := false
	if !isAbsent(b.Logprobs) {
		if err := json.Unmarshal(b.Logprobs, &on); err != nil {
			return badRequest("logprobs", "invalid_type", "logprobs must be a boolean")
		}
	}
	top := 0
	if b.TopLogprobs != nil {
		top = *b.TopLogprobs
		if top < 0 || top > maxLogprobs {
			return badRequest("top_logprobs", "invalid_value", "top_logprobs must be in 0..%d, got %d", maxLogprobs, top)
		}
		if top > 0 && !on {
			return badRequest("top_logprobs", "invalid_value", "top_logprobs requires logprobs: true")
		}
	}
	if on {
		p.logprobs = top
	}
	return nil
}

// maxTokens sets p.maxTokens from max_tokens or chat's
// max_completion_tokens.
func (b *completionBody) maxTokens(p *params) *apiError {
	switch {
	case b.MaxTokens != nil && b.MaxCompletionTokens != nil && *b.MaxTokens != *b.MaxCompletionTokens:
		return badRequest("max_tokens", "invalid_value", "max_tokens (%d) and max_completion_tokens (%d) differ: give one", *b.MaxTokens, *b.MaxCompletionTokens)
	case b.MaxCompletionTokens != nil:
		p.maxTokens, p.maxParam = *b.MaxCompletionTokens, "max_completion_tokens"
	case b.MaxTokens != nil:
		p.maxTokens, p.maxParam = *b.MaxTokens, "max_tokens"
	default:
		return nil
	}
	if p.maxTokens < 1 {
		return badRequest(p.maxParam, "invalid_value", "%s must be at least 1, got %d", p.maxParam, p.maxTokens)
	}
	return nil
}

// stops returns the stop strings, dropping empty ones.
func (b *completionBody) stops() ([]string, *apiError) {
	if isAbsent(b.Stop) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(b.Stop, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(b.Stop, &many); err != nil {
		return nil, badRequest("stop", "invalid_type", "stop must be a string or an array of strings")
	}
	if len(many) > maxStops {
		return nil, badRequest("stop", "invalid_value", "at most %d stop strings are allowed, got %d", maxStops, len(many))
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// promptTypeError is the 400 of a prompt of none of the accepted shapes.
func promptTypeError() *apiError {
	return badRequest("prompt", "invalid_type", "prompt must be a string, an array of token ids, or an array of either (batched prompts)")
}

func nonEmpty(ids []int32, param string) ([]int32, *apiError) {
	if len(ids) == 0 {
		return nil, badRequest(param, "empty_prompt", "%s must not be empty", param)
	}
	return ids, nil
}

func checkIDs(ids []int32, vocab int) ([]int32, *apiError) {
	if len(ids) == 0 {
		return nil, badRequest("prompt", "empty_prompt", "prompt must not be empty")
	}
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return nil, badRequest("prompt", "invalid_token", "prompt token %d at index %d is outside the vocabulary [0, %d)", id, i, vocab)
		}
	}
	return ids, nil
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// chatMessages returns the validated messages of a chat request, their
// content flattened to text, with name, an assistant's tool_calls and
// reasoning_content, and a tool message's tool_call_id. Other fields of
// a message (refusal, annotations, … as a client sends back a previous
// reply) are ignored.
func chatMessages(raw json.RawMessage) ([]chattmpl.Message, *apiError) {
	if isAbsent(raw) {
		return nil, badRequest("messages", "missing_messages", "messages is required")
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest("messages", "invalid_type", "messages must be an array of {role, content} objects")
	}
	if len(msgs) == 0 {
		return nil, badRequest("messages", "empty_prompt", "messages must not be empty")
	}
	out := make([]chattmpl.Message, len(msgs))
	for i, rm := range msgs {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(rm, &m); err != nil || m == nil {
			return nil, badRequest(fmt.Sprintf("messages[%d]", i), "invalid_type", "messages[%d] must be an object", i)
		}
		var role string
		if err := json.Unmarshal(m["role"], &role); err != nil || !chatRoles[role] {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value", "messages[%d].role must be system, developer, user, assistant or tool", i)
		}
		content, err := messageText(m["content"])
		if err != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "invalid_type", "messages[%d].%v", i, err)
		}
		msg := chattmpl.Message{Role: role, Content: content}
		for _, f := range []struct {
			name string
			dst  *string
		}{{"name", &msg.Name}, {"tool_call_id", &msg.ToolCallID}, {"reasoning_content", &msg.Reasoning}} {
			if v := m[f.name]; !isAbsent(v) {
				if err := json.Unmarshal(v, f.dst); err != nil {
					return nil, badRequest(fmt.Sprintf("messages[%d].%s", i, f.name), "invalid_type", "messages[%d].%s must be a string", i, f.name)
				}
			}
		}
		if v := m["tool_calls"]; role == "assistant" && !isAbsent(v) {
			var aerr *apiError
			if msg.ToolCalls, aerr = toolCallsOf(v, i); aerr != nil {
				return nil, aerr
			}
		}
		out[i] = msg
	}
	return out, nil
}

// renderFlat renders msgs with the tokenizer's own chat template when it
// has one (engine.ChatTemplater), else with the byte-level template of the
// package doc. A template that cannot render msgs is a 400 whose message
// holds none of the template's error text (the request log has it).
func renderFlat(tok engine.Tokenizer, msgs []engine.ChatMessage) (string, *apiError) {
	if ct, ok := tok.(engine.ChatTemplater); ok {
		text, err := ct.ApplyChatTemplate(msgs)
		if err != nil {
			e := badRequest("messages", "chat_template_error", "the model's chat template cannot render these messages")
			e.cause = err
			return "", e
		}
		return text, nil
	}
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString("<|" + m.Role + "|>\n")
		sb.WriteString(m.Content)
		sb.WriteString("\n")
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String(), nil
}

// messageText returns a message's text content: a string, or the text
// parts of an array joined. Its errors are client-facing, after
// "messages[i].".
func messageText(raw json.RawMessage) (string, error) {
	if isAbsent(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of text parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q is not supported (text only)", p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// isAbsent reports whether a raw field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}
