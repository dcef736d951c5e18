package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/pkg/workload"
)

func distWorkload(t *testing.T, prefix int) *workload.Workload {
	t.Helper()
	in, _ := workload.ParseDist("uniform:min=200,max=600")
	out, _ := workload.ParseDist("uniform:min=50,max=150")
	w, err := workload.FromDists(in, out, prefix, 40, 1, workload.Synth{})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// The planner sees the shared prefix as blocks every prompt names and
// the rest as each prompt's own.
func TestPlanWorkloadBlocks(t *testing.T) {
	if pw := planWorkload(distWorkload(t, 0), 1); pw.HasBlocks() {
		t.Error("a workload without a shared prefix names blocks")
	}
	w := distWorkload(t, 64)
	pw := planWorkload(w, 1)
	if !pw.HasBlocks() || pw.BlockTokens != 16 {
		t.Fatalf("blocks %v of %d tokens", pw.HasBlocks(), pw.BlockTokens)
	}
	seen := map[int32]int{}
	for i, bs := range pw.Blocks {
		if len(bs) != w.Requests[i].PromptLen/16 || pw.Lengths[i].In != w.Requests[i].PromptLen {
			t.Fatalf("request %d: %d blocks for %d tokens", i, len(bs), pw.Lengths[i].In)
		}
		for j, b := range bs {
			if j < 4 && b != int32(j) {
				t.Fatalf("request %d: block %d of the prefix is %d", i, j, b)
			}
			seen[b]++
		}
	}
	for b, n := range seen {
		if (b < 4) != (n == len(pw.Blocks)) || (b >= 4 && n != 1) {
			t.Errorf("block %d named by %d prompts", b, n)
		}
	}
	// An infinite cache saves the prefix of every prompt but the first.
	all := 0
	for _, r := range w.Requests {
		all += r.PromptLen
	}
	want := float64(64*(len(w.Requests)-1)) / float64(all)
	if got := pw.PrefixCeiling(); got < want-1e-9 || got > want+1e-9 {
		t.Errorf("PrefixCeiling %.4f, want %.4f", got, want)
	}
}

// --pd-split auto runs the split the planner predicts best, and a given
// split is labelled when the planner would choose another.
func TestSplitChoice(t *testing.T) {
	// 200 requests a simulation, not 2000: what is checked is that the
	// split run, the planner's and the best predicted agree, and how each
	// is labelled, which holds at any simulation size.
	defer func(n int) { planRequests = n }(planRequests)
	planRequests = 200
	o := defaultBenchOptions()
	o.slo = metrics.SLO{TTFT: 250 * time.Millisecond, TPOT: 100 * time.Millisecond}
	o.loaded = distWorkload(t, 256)
	d := defaultDeployFlags()
	d.Split = splitAuto
	c, err := splitChoice(t.Context(), d, o, 0.9, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Predicted) != 2 || c.Cached == "" || !c.Auto {
		t.Fatalf("choice %+v: want 1:2 and 2:1 weighed, the shared prefix counted", c)
	}
	best := c.Predicted[0]
	for _, p := range c.Predicted {
		if p.MaxRate > best.MaxRate {
			best = p
		}
	}
	if c.Ran != best.Split || c.Planner != best.Split || d.Split != best.Split {
		t.Errorf("ran %s (flag now %s), planner %s; the best predicted is %s", c.Ran, d.Split, c.Planner, best.Split)
	}
	if !strings.Contains(c.Text(), "chosen by the planner") {
		t.Errorf("auto split text: %s", c.Text())
	}

	other := "1:2"
	if best.Split == other {
		other = "2:1"
	}
	d.Split = other
	c, err = splitChoice(t.Context(), d, o, 0.9, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Ran != other || c.Planner != best.Split || !strings.Contains(c.Text(), "a split the planner would not choose") {
		t.Errorf("given %s, planner %s: %s", c.Ran, c.Planner, c.Text())
	}
	d.Split = best.Split
	if c, _ = splitChoice(t.Context(), d, o, 0.9, ""); strings.Contains(c.Text(), "would not choose") {
		t.Errorf("the planner's own split is labelled: %s", c.Text())
	}

	// Without a TPOT SLO there is nothing to plan on: auto is refused, a
	// given split runs unlabelled with the reason.
	o.slo.TPOT = 0
	d.Split = splitAuto
	if _, err := splitChoice(t.Context(), d, o, 0.9, ""); !errors.Is(err, errUsage) {
		t.Errorf("auto without TPOT SLO: %v, want a usage error", err)
	}
	d.Split = "2:1"
	c, err = splitChoice(t.Context(), d, o, 0.9, "")
	if err != nil || c.Planner != "" || !strings.Contains(c.Text(), "not consulted") {
		t.Errorf("given split without TPOT SLO: %v, %+v", err, c)
	}
	if c, err := splitChoice(t.Context(), d, o, 0.9, "http://x"); c != nil || err != nil {
		t.Errorf("deployment by URL: %v, %v", c, err)
	}
	d.Split = splitAuto
	if _, err := splitChoice(t.Context(), d, o, 0.9, "http://x"); !errors.Is(err, errUsage) {
		t.Errorf("auto with --disagg-url: %v, want a usage error", err)
	}
}
