package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestWorkerPriorityOrdersPrefill: with the prefill worker saturated (one
// request a step, its first step held while four batch requests queue
// behind it), two interactive requests sent after the batch ones start
// their prefill before every batch request but the one already running,
// so their TTFT p50 is under the batch requests' p50. The order is that
// of the request log's t_prefill_start stamps, not a timing. Every
// request completes. Fails on FCFS prefill (the interactive requests
// would start after the four batch ones), e.g. without
// PrefillRequest.priority or with the batch's Overtakes 0.
func TestWorkerPriorityOrdersPrefill(t *testing.T) {
	checkNoLeaks(t)
	const promptTokens = 48
	var held *heldPrefill
	core, logs := observer.New(zapcore.InfoLevel)
	cl := startCluster(t, clusterOpts{
		log: zap.New(zapcore.NewTee(core, testLogger(t).Core())),
		worker: func(wo *workerrun.Options) {
			if wo.Role != control.RolePrefill {
				return
			}
			// One request in a step, in chunks of 16: 3 steps a prompt.
			wo.Prefill.ChunkTokens, wo.Prefill.MaxBatchTokens = 16, 16
			e, err := enginebuild.Build(enginecfg.DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { enginebuild.Close(e) })
			held = &heldPrefill{Engine: e, gate: make(chan struct{})}
			wo.EngineOverride = held
		},
	})
	var once sync.Once
	open := func() { once.Do(func() { close(held.gate) }) }
	t.Cleanup(open)

	type sent struct {
		id    string
		batch bool
		err   error
	}
	done := make(chan sent, 8)
	send := func(i int, batch bool) {
		prompt := make([]int32, promptTokens)
		for j := range prompt {
			prompt[j] = int32(1 + (i*promptTokens+j)%200)
		}
		data, err := json.Marshal(request{Prompt: prompt, MaxTokens: 2, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			s := sent{batch: batch}
			defer func() { done <- s }()
			req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, cl.url+"/v1/completions", bytes.NewReader(data))
			if err != nil {
				s.err = err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if batch {
				req.Header.Set(frontend.HeaderPriority, "batch")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				s.err = err
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var out struct {
				ID string `json:"id"`
			}
			if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil {
				s.err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
				return
			}
			s.id = out.ID
		}()
	}
	// queued waits until the prefill worker's heartbeat says n prompts
	// wait for prefill (none computed yet: the first step is held).
	queued := func(n int) {
		waitFor(t, 10*time.Second, func() error {
			ms := cl.c.Membership().Members(control.RolePrefill)
			if len(ms) != 1 || ms[0].QueuedPrefillTokens != n*promptTokens {
				return fmt.Errorf("prefill workers %+v, want one with %d queued tokens", ms, n*promptTokens)
			}
			return nil
		})
	}
	for i := range 4 {
		send(i, true)
	}
	queued(4)
	waitFor(t, 10*time.Second, func() error {
		if held.started.Load() == 0 {
			return fmt.Errorf("no prefill step started")
		}
		return nil
	})
	for i := range 2 {
		send(4+i, false)
	}
	queued(6)
	open()
	batchIDs := map[string]bool{}
	for range 6 {
		s := <-done
		if s.err != nil {
			t.Fatalf("request (batch %v): %v", s.batch, s.err)
		}
		batchIDs[s.id] = s.batch
	}

	// The request log: each request's prefill start, by priority.
	var inter, batch []time.Time
	waitFor(t, 10*time.Second, func() error {
		inter, batch = nil, nil
		for _, e := range logs.FilterMessage("request").All() {
			f := e.ContextMap()
			id, _ := f["request_id"].(string)
			isBatch, ok := batchIDs[id]
			at, _ := f["t_prefill_start"].(time.Time)
			if !ok || at.IsZero() {
				continue
			}
			if p, _ := f["priority"].(string); (p == "batch") != isBatch {
				return fmt.Errorf("request %s logged priority %q, sent batch %v", id, p, isBatch)
			}
			if isBatch {
				batch = append(batch, at)
			} else {
				inter = append(inter, at)
			}
		}
		if len(inter) != 2 || len(batch) != 4 {
			return fmt.Errorf("logged prefill starts of %d interactive and %d batch requests, want 2 and 4", len(inter), len(batch))
		}
		return nil
	})
	slices.SortFunc(batch, func(a, b time.Time) int { return a.Compare(b) })
	for i, at := range inter {
		if !at.Before(batch[1]) {
			t.Errorf("interactive request %d started its prefill at %v, not before the second batch request's %v (batch starts %v)", i, at, batch[1], batch)
		}
	}
}
