package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/agentloop"
	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/loadtest/report"
)

// agentResult is agentloop's result JSON.
type agentResult struct {
	Date        string                       `json:"date"`
	Command     string                       `json:"command"`
	LoadAverage map[string]string            `json:"load_average,omitempty"` // /proc/loadavg before and after
	Deployment  report.Object                `json:"deployment,omitempty"`
	BaseURL     string                       `json:"base_url,omitempty"`
	Loops       int                          `json:"loops"`
	Turns       int                          `json:"turns"`
	Options     map[string]any               `json:"options"`
	Transports  map[string]agentloop.Summary `json:"transports"`
	// Ratios are WebSocket over HTTP (present when both ran): per turn
	// the p50 client TTFT and server TTFT, and the p50 loop time.
	Ratios *agentRatios                `json:"ratios_ws_over_http,omitempty"`
	Raw    map[string][]agentloop.Loop `json:"loops_detail"`
}

type agentRatios struct {
	TTFTP50PerTurn       []float64 `json:"ttft_p50_per_turn"`
	ServerTTFTP50PerTurn []float64 `json:"server_ttft_p50_per_turn"`
	E2EP50               float64   `json:"e2e_p50"`
}

// cmdAgentLoop is `loadtest agentloop`: concurrent agent loops with one
// tool call per turn, continued over the Responses API's WebSocket mode
// and resent whole over HTTP chat completions.
func cmdAgentLoop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultBenchOptions()
	o.Seed = 1
	d := defaultDeployFlags()
	d.GPUs = 2
	var local, transports string
	ao := agentloop.Options{Loops: 8, Turns: 10, MaxOutputTokens: 160, InstructionsBytes: 1024, ToolOutputBytes: 256}
	fs := flag.NewFlagSet("agentloop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "agentloop [--base-url URL | --local colocated|disaggregated] [flags]",
		"Runs --loops agent loops at once, each --turns turns of one forced function call (tool_choice\n"+
			"required, one function) whose output the next turn sends back, over each of --transports:\n"+
			"ws continues with previous_response_id over the Responses API's WebSocket mode (GET\n"+
			"/v1/responses upgraded), sending only the function_call_output; http resends the whole\n"+
			"conversation to /v1/chat/completions. Reports per turn the p50 TTFT (client: request sent to\n"+
			"the first output event; server: the pdserve budget's), prompt tokens and prefix-cache hit\n"+
			"tokens, the p50 end-to-end time of a loop, and WebSocket/HTTP ratios. With --local each\n"+
			"transport runs on a fresh deployment started here (sim, ref or llamacpp engine: the same\n"+
			"flags as compare), with the same prompts; with --base-url both share the server, and their\n"+
			"prompts share no prefix.",
		"  # 8 loops of 10 turns on 2 colocated workers of Llama-3-8B on H100 (performance model):\n"+
			"  go run ./loadtest agentloop --local colocated --profile h100/llama-3-8b/tp1 --gpus 2 --save-result\n"+
			"  # On llama.cpp, one colocated worker on cores 0 and 1:\n"+
			"  go run ./loadtest agentloop --local colocated --engine llamacpp --model-file tiny.gguf --cpus 0,1 --gpus 2\n")
	// The shared flags agentloop reads, registered as run and compare
	// register them.
	all := flag.NewFlagSet("", flag.ContinueOnError)
	o.addFlags(all)
	d.addFlags(all)
	for _, name := range []string{"base-url", "model", "api-key", "temperature", "seed", "request-timeout", "save-result", "result-dir", "result-filename", "quiet",
		"engine", "profile", "preset", "payload-scale", "gpus", "pd-split", "codec", "link-gbps", "first-token-policy", "chunk-tokens", "max-batch-tokens",
		"max-batch", "kv-blocks", "deploy-log", "model-file", "llama-lib", "cpus", "ctx-size", "max-seqs", "no-repack"} {
		f := all.Lookup(name)
		fs.Var(f.Value, f.Name, f.Usage)
	}
	fs.StringVar(&local, "local", "", "start a local deployment for the run: colocated or disaggregated (default: use --base-url)")
	fs.IntVar(&ao.Loops, "loops", ao.Loops, "agent loops run at once")
	fs.IntVar(&ao.Turns, "turns", ao.Turns, "turns per loop, each one tool call")
	fs.IntVar(&ao.MaxOutputTokens, "max-output-tokens", ao.MaxOutputTokens, "output token budget of a turn (max_output_tokens, max_tokens); must hold one call")
	fs.IntVar(&ao.InstructionsBytes, "instructions-bytes", ao.InstructionsBytes, "bytes of the system prompt (instructions) every loop shares")
	fs.IntVar(&ao.ToolOutputBytes, "tool-output-bytes", ao.ToolOutputBytes, "bytes of each tool output a turn sends back")
	fs.StringVar(&transports, "transports", "ws,http", "transports to run, in order: ws, http or both")
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	ao.Model, ao.APIKey, ao.Temperature, ao.Seed, ao.TurnTimeout = o.Model, o.APIKey, o.Temperature, o.Seed, o.RequestTimeout
	check := ao
	check.BaseURL = "set below" // the rest is checked before anything starts
	if err := check.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var trs []string
	for _, tr := range strings.Split(transports, ",") {
		if tr = strings.TrimSpace(tr); tr != agentloop.WS && tr != agentloop.HTTP {
			return fmt.Errorf("%w: --transports %q: want ws, http or ws,http", errUsage, transports)
		}
		trs = append(trs, tr)
	}
	switch local {
	case "", deploy.Colocated, deploy.Disaggregated:
	default:
		return fmt.Errorf("%w: --local %q: want colocated or disaggregated", errUsage, local)
	}
	if local != "" && o.BaseURL != "" {
		return fmt.Errorf("%w: give --local or --base-url, not both", errUsage)
	}
	if local == "" && o.BaseURL == "" {
		o.BaseURL = fmt.Sprintf("http://%s:%d", o.Host, o.Port)
	}

	res := agentResult{Date: time.Now().UTC().Format(time.RFC3339), Command: "go run ./loadtest agentloop " + strings.Join(args, " "),
		Loops: ao.Loops, Turns: ao.Turns, LoadAverage: map[string]string{"before": loadAvg()},
		Options: map[string]any{"max_output_tokens": ao.MaxOutputTokens, "instructions_bytes": ao.InstructionsBytes, "tool_output_bytes": ao.ToolOutputBytes,
			"temperature": ao.Temperature, "seed": ao.Seed, "transports": trs},
		Transports: map[string]agentloop.Summary{}, Raw: map[string][]agentloop.Loop{}}
	for _, tr := range trs {
		ro := ao
		ro.Tag = "agentloop"
		stop := func() {}
		if local == "" {
			ro.BaseURL, ro.Tag = strings.TrimRight(o.BaseURL, "/"), "agentloop-"+tr // one server: no prefix shared across transports
			res.BaseURL = ro.BaseURL
		} else {
			// A fresh deployment per transport, the same prompts.
			url, facts, s, err := d.startLocal(ctx, local, 1, stderr)
			if err != nil {
				return err
			}
			ro.BaseURL, res.Deployment, stop = url, facts, s
		}
		if !o.Quiet {
			fmt.Fprintf(stderr, "%s: %d loops × %d turns against %s\n", tr, ro.Loops, ro.Turns, ro.BaseURL)
		}
		loops, err := agentloop.Run(ctx, tr, ro)
		stop()
		if err != nil {
			return err
		}
		res.Raw[tr], res.Transports[tr] = loops, agentloop.Summarize(loops, ao.Turns)
	}
	res.LoadAverage["after"] = loadAvg()
	ws, okW := res.Transports[agentloop.WS]
	hs, okH := res.Transports[agentloop.HTTP]
	if okW && okH {
		r := &agentRatios{E2EP50: ratio(ws.E2EMsP50, hs.E2EMsP50)}
		for k := range ws.PerTurn {
			r.TTFTP50PerTurn = append(r.TTFTP50PerTurn, ratio(ws.PerTurn[k].TTFTMs.P50, hs.PerTurn[k].TTFTMs.P50))
			r.ServerTTFTP50PerTurn = append(r.ServerTTFTP50PerTurn, ratio(ws.PerTurn[k].ServerTTFTMsP50, hs.PerTurn[k].ServerTTFTMsP50))
		}
		res.Ratios = r
	}
	writeAgentReport(stdout, &res, trs)
	if o.SaveResult {
		name := o.ResultFilename
		if name == "" {
			name = fmt.Sprintf("agentloop-%s.json", time.Now().UTC().Format("20060102-150405"))
		}
		path := filepath.Join(o.ResultDir, name)
		data, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("save result: %w", err)
		}
		fmt.Fprintf(stderr, "result saved to %s\n", path)
	}
	var failed []string
	for _, tr := range trs {
		if s := res.Transports[tr]; s.Failed > 0 {
			failed = append(failed, fmt.Sprintf("%s: %d of %d loops failed (%s)", tr, s.Failed, s.Loops, strings.Join(s.Errors, "; ")))
		}
	}
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "\n"))
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// loadAvg returns the 1, 5 and 15 minute load averages, "" where the
// system does not say.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// writeAgentReport prints the run's Markdown summary.
func writeAgentReport(w io.Writer, r *agentResult, trs []string) {
	fmt.Fprintf(w, "## Agent loops: %d at once × %d turns, one tool call per turn\n\n", r.Loops, r.Turns)
	if r.Deployment != nil {
		for _, kv := range r.Deployment {
			fmt.Fprintf(w, "- %s: %v\n", kv.Key, kv.Value)
		}
	}
	fmt.Fprintf(w, "- load average (1/5/15 min): before %s, after %s\n\n", r.LoadAverage["before"], r.LoadAverage["after"])
	both := r.Ratios != nil
	fmt.Fprint(w, "| turn |")
	for _, tr := range trs {
		fmt.Fprintf(w, " %s TTFT p50 (ms) | %s server TTFT p50 | %s prompt tok | %s hit tok p50 | %s decode hit p50 | %s same worker | %s request bytes |", tr, tr, tr, tr, tr, tr, tr)
	}
	if both {
		fmt.Fprint(w, " TTFT ws/http | server TTFT ws/http |")
	}
	fmt.Fprint(w, "\n|---|")
	for range trs {
		fmt.Fprint(w, "---|---|---|---|---|---|---|")
	}
	if both {
		fmt.Fprint(w, "---|---|")
	}
	fmt.Fprintln(w)
	for k := range r.Turns {
		fmt.Fprintf(w, "| %d |", k+1)
		for _, tr := range trs {
			ps := r.Transports[tr].PerTurn
			if k >= len(ps) {
				fmt.Fprint(w, " | | | | | | |")
				continue
			}
			p := ps[k]
			fmt.Fprintf(w, " %.1f | %.1f | %.0f | %.0f | %.0f | %d/%d | %.0f |", p.TTFTMs.P50, p.ServerTTFTMsP50, p.PromptTokensP50, p.PrefixHitTokensP50, p.DecodeHitTokensP50, p.SameWorker, p.Loops, p.RequestBytesP50)
		}
		if both && k < len(r.Ratios.TTFTP50PerTurn) {
			fmt.Fprintf(w, " %.2f | %.2f |", r.Ratios.TTFTP50PerTurn[k], r.Ratios.ServerTTFTP50PerTurn[k])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	for _, tr := range trs {
		s := r.Transports[tr]
		fmt.Fprintf(w, "- %s: loop end-to-end p50 %.0f ms, mean %.0f ms; %d of %d loops failed\n", tr, s.E2EMsP50, s.E2EMsMean, s.Failed, s.Loops)
	}
	if both {
		fmt.Fprintf(w, "- end-to-end p50 ws/http: %.2f\n", r.Ratios.E2EP50)
	}
}
