package agentloop_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/loadtest/agentloop"
	"github.com/pdserve/pdserve/loadtest/deploy"
)

// TestLoopsOverBothTransports runs two 3-turn loops over each transport,
// each against a fresh colocated sim worker (Llama-3-8B on an H100, at a
// tenth of real time) with the same prompts: every turn makes its one
// call; the WebSocket continuation, which sends only the new input, is
// the same conversation as HTTP's full resend, token for token (equal
// prompt tokens each turn, growing), and its requests are the smaller. It
// fails when the server renders a continuation other than the resent
// conversation (previous turn lost, or rendered another way), when
// either side loses a call, or when the sizes swap.
func TestLoopsOverBothTransports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const turns = 3
	sums := map[string]agentloop.Summary{}
	for _, tr := range []string{agentloop.WS, agentloop.HTTP} {
		l, err := deploy.Start(ctx, deploy.Spec{Mode: deploy.Colocated, Engine: "sim", Profile: "h100/llama-3-8b/tp1", TimeScale: 0.1, PayloadScale: 1.0 / 1024, DecodeWorkers: 1}, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		o := agentloop.Options{BaseURL: l.URL(), Loops: 2, Turns: turns, MaxOutputTokens: 160, InstructionsBytes: 300, ToolOutputBytes: 100, Seed: 1, Tag: "t", TurnTimeout: time.Minute}
		loops, err := agentloop.Run(ctx, tr, o)
		if cerr := l.Close(context.Background()); cerr != nil {
			t.Error(cerr)
		}
		if err != nil {
			t.Fatal(err)
		}
		s := agentloop.Summarize(loops, turns)
		if s.Failed != 0 {
			t.Fatalf("%s: %d loops failed: %v", tr, s.Failed, s.Errors)
		}
		for k, ts := range s.PerTurn {
			if ts.Loops != 2 || ts.TTFTMs.P50 <= 0 || ts.PromptTokensP50 <= 0 || (k > 0 && ts.PromptTokensP50 <= s.PerTurn[k-1].PromptTokensP50) {
				t.Errorf("%s turn %d: %+v", tr, k+1, ts)
			}
		}
		sums[tr] = s
	}
	ws, http := sums[agentloop.WS].PerTurn, sums[agentloop.HTTP].PerTurn
	for k := range turns {
		if ws[k].PromptTokensP50 != http[k].PromptTokensP50 {
			t.Errorf("turn %d: %v prompt tokens over WebSocket, %v over HTTP: want the same conversation", k+1, ws[k].PromptTokensP50, http[k].PromptTokensP50)
		}
	}
	// The WebSocket's last turn sends its tool output and no history;
	// HTTP's resends the whole conversation, more each turn.
	if ws[turns-1].RequestBytesP50 >= http[turns-1].RequestBytesP50 || http[turns-1].RequestBytesP50 <= http[1].RequestBytesP50 {
		t.Errorf("request bytes per turn: WebSocket %+v, HTTP %+v", ws, http)
	}
}
