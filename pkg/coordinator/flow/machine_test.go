package flow

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/router"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt from the Machine's")

// TestScenarios runs the scenarios of testdata/*.txt, in the datadriven
// style: blocks of a command line with its arguments, a "----" line and
// the expected output, up to a blank line. Lines starting with # are
// comments. `new` starts a request (a Machine); every other command is an
// event stepped into it, and its output is the actions the Step returned,
// one a line (see formatAction), then "(done)" once the request ended.
// The test is the Machine's shell: it applies the Record actions to the
// request's budget trace (not printed; `trace` and `hits` show it).
// -rewrite regenerates the expected output.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata/*.txt")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runFile(t, f) })
	}
}

type block struct {
	line int      // of the command
	pre  []string // comments and blank lines before the command
	cmd  string
	want []string
}

func parseFile(t *testing.T, path string) ([]block, []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var blocks []block
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		b := block{line: i + 1, pre: pre, cmd: l}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command %q not followed by ----", path, i+1, l)
		}
		i += 2
		for ; i < len(lines) && lines[i] != ""; i++ {
			b.want = append(b.want, lines[i])
		}
		blocks = append(blocks, b)
	}
	return blocks, pre
}

func runFile(t *testing.T, path string) {
	blocks, tail := parseFile(t, path)
	var out strings.Builder
	var m *Machine
	var tr *budget.Trace
	failed := false
	for _, b := range blocks {
		got, err := runCommand(&m, &tr, b.cmd)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, b.line, b.cmd, err)
		}
		if !*rewrite && !slices.Equal(got, b.want) {
			failed = true
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, b.line, b.cmd, strings.Join(got, "\n"), strings.Join(b.want, "\n"))
		}
		for _, l := range b.pre {
			out.WriteString(l + "\n")
		}
		out.WriteString(b.cmd + "\n----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
		out.WriteString("\n")
	}
	for _, l := range tail {
		out.WriteString(l + "\n")
	}
	if *rewrite && !failed {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// args is a command's arguments: key=value or a bare key.
type args map[string]string

func parseArgs(fields []string) args {
	a := args{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		a[k] = v
	}
	return a
}

func (a args) has(k string) bool { _, ok := a[k]; return ok }

func (a args) int(k string, def int) (int, error) {
	v, ok := a[k]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", k, v, err)
	}
	return n, nil
}

func (a args) tokens(k string) ([]int32, error) {
	v := a[k]
	if v == "" {
		return nil, nil
	}
	var out []int32
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", k, v, err)
		}
		out = append(out, int32(n))
	}
	return out, nil
}

func worker(name string) router.Worker {
	if name == "" {
		return router.Worker{}
	}
	return router.Worker{ID: name, Addr: name + ":7000"}
}

// callErr is err=CODE (a CallError of that Code, by its name, e.g.
// unavailable), with transfer the prefill worker's failed KV transfer
// of that code, with grammar a grammar that allows no token.
func callErr(a args) (*CallError, error) {
	name, ok := a["err"]
	if !ok {
		return nil, nil
	}
	for c := CodeBroken; c <= CodeRefused; c++ {
		if c.String() == name {
			return &CallError{Code: c, Transfer: a.has("transfer"), Grammar: a.has("grammar"), Err: errors.New("scripted " + name)}, nil
		}
	}
	return nil, fmt.Errorf("unknown code %q", name)
}

var at0 = time.Unix(1000, 0)

func runCommand(mp **Machine, trp **budget.Trace, line string) ([]string, error) {
	fields := strings.Fields(line)
	cmd, a := fields[0], parseArgs(fields[1:])
	if cmd == "new" {
		n, err := a.int("n", 1)
		if err != nil {
			return nil, err
		}
		eog, err := a.tokens("eog")
		if err != nil {
			return nil, err
		}
		cfg := Config{ID: "req-1", Model: "m", PromptTokens: 32, MaxTokens: 4, N: n, Mode: ModeDisaggregated, Policy: PolicyPrefill,
			IgnoreEOS: a.has("ignore-eos"), EOG: map[int32]bool{}, Logprobs: a.has("logprobs"), PromptLogprobs: a.has("prompt-logprobs")}
		if v, ok := a["mode"]; ok {
			cfg.Mode = v
		}
		if v, ok := a["policy"]; ok {
			cfg.Policy = v
		}
		for _, id := range eog {
			cfg.EOG[id] = true
		}
		m, err := NewMachine(cfg)
		if err != nil {
			return []string{"error: " + err.Error()}, nil
		}
		*mp, *trp = m, &budget.Trace{}
		return nil, nil
	}
	m := *mp
	if m == nil {
		return nil, errors.New("no request: start with new")
	}
	if cmd == "trace" {
		tr := *trp
		return []string{fmt.Sprintf("mode=%s policy=%s prefill=%s decode=%s recoveries=%d prefill-retries=%d prefix-hit=%d routed-hit=%d decode-hit=%d",
			tr.Mode, tr.FirstTokenPolicy, tr.PrefillWorker, tr.DecodeWorker, tr.Recoveries, tr.PrefillRetries,
			tr.PrefixHitTokens, tr.RoutedPrefixHitTokens, tr.DecodePrefixHitTokens)}, nil
	}
	if cmd == "hits" {
		tr := *trp
		return []string{fmt.Sprintf("prefix-hit=%d host-hit=%d disk-hit=%d peer-hit=%d peer-load=%v",
			tr.PrefixHitTokens, tr.HostHitTokens, tr.DiskHitTokens, tr.PeerHitTokens, tr.PeerLoad)}, nil
	}
	ev, err := parseEvent(cmd, a)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, act := range m.Step(ev) {
		if r, ok := act.(Record); ok {
			r.Budget.Apply(*trp)
			continue
		}
		out = append(out, formatAction(m, act))
	}
	if m.Done() {
		out = append(out, "(done)")
	}
	return out, nil
}

func parseEvent(cmd string, a args) (Event, error) {
	attempt, err := a.int("a", 0)
	if err != nil {
		return nil, err
	}
	cerr, err := callErr(a)
	if err != nil {
		return nil, err
	}
	switch cmd {
	case "start":
		return Start{}, nil
	case "routed":
		hit, err := a.int("hit", 0)
		if err != nil {
			return nil, err
		}
		short, err := a.int("short", 0)
		if err != nil {
			return nil, err
		}
		// peer: the pull of the worker that prefills; local-peer: the
		// decode worker's (16 tokens each).
		ev := Routed{Decision: router.Decision{Decode: worker(a["decode"]), Prefill: worker(a["prefill"]), Local: a["prefill"] == "", PrefixHitTokens: hit,
			ShortBelow: short}}
		if v := a["peer"]; v != "" {
			ev.Decision.Peer = router.Pull{From: worker(v), Tokens: 16}
		}
		if v := a["local-peer"]; v != "" {
			ev.Decision.LocalPeer = router.Pull{From: worker(v), Tokens: 16}
		}
		switch a["fail"] {
		case "":
		case "no-decode":
			ev.Err = router.ErrNoDecodeWorkers
		case "no-capacity":
			ev.Err = router.ErrNoCapacity
		default:
			ev.Err = errors.New(a["fail"])
		}
		return ev, nil
	case "reserved":
		hit, err := a.int("hit", 0)
		if err != nil {
			return nil, err
		}
		return Reserved{Hit: hit, Err: cerr, At: at0, PromptHeld: a.has("held")}, nil
	case "prefill-queued":
		return PrefillQueued{Attempt: attempt, At: time.Unix(0, 1)}, nil
	case "prefill-first":
		tok, err := a.int("tok", 7)
		if err != nil {
			return nil, err
		}
		hit, err := a.int("hit", 0)
		if err != nil {
			return nil, err
		}
		ft := FirstToken{Attempt: attempt, Token: int32(tok), Hits: Hits{Prefix: hit}}
		if v, ok := a["lp"]; ok {
			f, err := strconv.ParseFloat(v, 32)
			if err != nil {
				return nil, fmt.Errorf("lp=%q: %w", v, err)
			}
			ft.Logprob = engine.TokenLogprob{Token: int32(tok), Logprob: float32(f)}
		}
		return ft, nil
	case "kv-done":
		return KVDone{Attempt: attempt, KV: KV{BytesRaw: 100}}, nil
	case "prefill-end":
		return PrefillEnded{Attempt: attempt, Err: cerr}, nil
	case "gen":
		toks, err := a.tokens("toks")
		if err != nil {
			return nil, err
		}
		idx, err := a.int("index", 0)
		if err != nil {
			return nil, err
		}
		resp := Tokens{Attempt: attempt, Index: idx, Tokens: toks, Finish: a["finish"], Migrated: a.has("migrated")}
		// A local prefill's prefix hit and its parts by tier: hit, host,
		// disk and peer tokens, peer-load milliseconds.
		for _, f := range []struct {
			name string
			set  func(int)
		}{
			{"hit", func(n int) { resp.Hits.Prefix = n }},
			{"host", func(n int) { resp.Hits.Host = n }},
			{"disk", func(n int) { resp.Hits.Disk = n }},
			{"peer", func(n int) { resp.Hits.Peer = n }},
			{"peer-load", func(n int) { resp.Hits.PeerLoad = time.Duration(n) * time.Millisecond }},
		} {
			n, err := a.int(f.name, 0)
			if err != nil {
				return nil, err
			}
			f.set(n)
		}
		if v, ok := a["lps"]; ok {
			// One log-probability per token, comma-separated; "-" is an
			// entry that carries only the token.
			for k, f := range strings.Split(v, ",") {
				lp := engine.TokenLogprob{}
				if k < len(toks) {
					lp.Token = toks[k]
				}
				if f != "-" {
					x, err := strconv.ParseFloat(f, 32)
					if err != nil {
						return nil, fmt.Errorf("lps=%q: %w", v, err)
					}
					lp.Logprob = float32(x)
				}
				resp.Logprobs = append(resp.Logprobs, lp)
			}
		}
		if n, err := a.int("prompt-logprobs", 0); err != nil {
			return nil, err
		} else {
			for range n {
				resp.PromptLogprobs = append(resp.PromptLogprobs, engine.TokenLogprob{})
			}
		}
		return resp, nil
	case "gen-end":
		return GenerateEnded{Attempt: attempt, Err: cerr}, nil
	case "resend":
		return ResendDone{Attempt: attempt, Err: cerr}, nil
	case "delivered":
		switch {
		case a.has("stopped"):
			return Delivered{Stopped: true}, nil
		case a.has("fail"):
			return Delivered{Err: errors.New(a["fail"])}, nil
		}
		return Delivered{}, nil
	case "gone":
		return ClientGone{Err: errors.New("context canceled")}, nil
	case "abort":
		return Abort{Err: errors.New("no connection")}, nil
	}
	return nil, fmt.Errorf("unknown command %q", cmd)
}

func names(ws []string) string { return "[" + strings.Join(ws, " ") + "]" }

// formatAction writes a as one line.
func formatAction(m *Machine, a Action) string {
	switch a := a.(type) {
	case Route:
		var ex []string
		for id := range a.Exclude {
			ex = append(ex, id)
		}
		slices.Sort(ex)
		decode := "all"
		if a.Decode != nil {
			decode = a.Decode.ID
		}
		trace := "none"
		switch {
		case a.Trace && a.Queue:
			trace = "queue"
		case a.Trace:
			trace = "plain"
		}
		return fmt.Sprintf("route decode=%s prefill=%t decode-only=%t local=%t trace=%s exclude=%s",
			decode, a.Prefill, a.Req.DecodeOnly, a.Req.Local, trace, names(ex))
	case Reserve:
		return fmt.Sprintf("reserve %s fresh=%t queue=%t", a.Worker.ID, a.Fresh, a.Queue)
	case Revised:
		return "revised"
	case Prefill:
		s := fmt.Sprintf("prefill %s to=%s skip=%d a=%d", a.Worker.ID, a.Decode.ID, a.SkipTokens, a.Attempt)
		if a.Peer.From.ID != "" {
			s += " peer=" + a.Peer.From.ID
		}
		return s
	case Generate:
		s := fmt.Sprintf("generate %s a=%d local=%t", a.Worker.ID, a.Attempt, a.LocalPrefill)
		if a.Peer.From.ID != "" {
			s += " peer=" + a.Peer.From.ID
		}
		if a.Generated != nil {
			s += fmt.Sprintf(" generated=%v", a.Generated)
		}
		if a.PromptLogprobs {
			s += " prompt-logprobs"
		}
		if a.OmitPrompt {
			s += " no-prompt"
		}
		if a.MigrateFrom != nil {
			s += " migrate-from=" + a.MigrateFrom.ID
		}
		return s
	case Resend:
		return fmt.Sprintf("resend %s to=%s a=%d", a.Prefill.ID, a.Decode.ID, a.Attempt)
	case CancelGenerate:
		return fmt.Sprintf("cancel-generate a=%d", a.Attempt)
	case PrefillDone:
		return "prefill-done"
	case Unreachable:
		return fmt.Sprintf("unreachable %s err=%s", a.Worker.ID, a.Err.Code)
	case Deliver:
		s := fmt.Sprintf("deliver choice=%d %v", a.Index, a.Tokens)
		if a.Logprobs != nil {
			// Each token's log-probability; a decode stream's first
			// entry without one would show as 0.
			lps := make([]string, len(a.Logprobs))
			for i, lp := range a.Logprobs {
				lps[i] = strconv.FormatFloat(float64(lp.Logprob), 'g', -1, 32)
			}
			s += " lp=[" + strings.Join(lps, " ") + "]"
		}
		return s
	case DeliverPrompt:
		return fmt.Sprintf("deliver-prompt n=%d", len(a.Logprobs))
	case Log:
		return fmt.Sprintf("log %s %q", a.Level, a.Msg)
	case Stop:
		return "stop"
	case Cancel:
		return "cancel " + a.Worker.ID
	case Release:
		return "release " + a.Worker.ID
	case Finish:
		return fmt.Sprintf("finish %v", m.Finish())
	case Fail:
		s := "fail: " + a.Err.Error()
		var f *Failure
		if errors.As(a.Err, &f) {
			s += fmt.Sprintf(" (client: %s", f.Kind)
			if f.Part != "" {
				s += ", " + f.Part
			}
			s += ")"
		}
		return s
	}
	return fmt.Sprintf("unknown action %T", a)
}
