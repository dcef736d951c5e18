package coordinator_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// refusalCounter is an Extension and RefusalObserver that counts the
// refusals it hears of.
type refusalCounter struct{ n atomic.Int32 }

func (*refusalCounter) Attach(coordinator.Host) error       { return nil }
func (*refusalCounter) Run(ctx context.Context)             { <-ctx.Done() }
func (*refusalCounter) ObserveTrace(*budget.Trace)          {}
func (c *refusalCounter) ObserveRefused(*budget.Trace, int) { c.n.Add(1) }

// TestOpenAISDKRetriedRefusal: the OpenAI Node SDK retries a 429 twice by
// default, marking each retry with X-Stainless-Retry-Count; the planner's
// demand (a RefusalObserver) hears of each refused call once, not once per
// try, and pdserve_planner_refusal_retries_total counts the retries left
// out. The request (10 prompt tokens + max_tokens 100) does not fit a
// decode worker of 4 KV blocks of 16 tokens: every try is refused with
// 429. Two calls of the same request are two requests: two refusals.
func TestOpenAISDKRetriedRefusal(t *testing.T) {
	sdk := sdkDir(t)
	rc := &refusalCounter{}
	cl := startCluster(t, clusterOpts{
		worker: func(wo *workerrun.Options) { wo.Decode.KVBlocks = 4 },
		edit:   func(o *coordinator.Options) { o.Extensions = append(o.Extensions, rc) },
	})
	outb := runSDK(t, sdk, cl.url, "testdata/openai_sdk_retries.mjs")
	var out struct {
		Calls []struct {
			Status int
			Tries  []string
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}
	if len(out.Calls) != 2 {
		t.Fatalf("calls %+v, want 2", out.Calls)
	}
	for i, c := range out.Calls {
		if c.Status != 429 || !slices.Equal(c.Tries, []string{"0", "1", "2"}) {
			t.Errorf("call %d: status %d, tries with X-Stainless-Retry-Count %q; want 429 after tries 0, 1, 2", i, c.Status, c.Tries)
		}
	}
	if n := rc.n.Load(); n != 2 {
		t.Errorf("the planner heard of %d refusals, want 2 (one per call, its retries left out)", n)
	}
	if m := scrape(t, cl); !strings.Contains(m, "\npdserve_planner_refusal_retries_total 4\n") {
		t.Errorf("want pdserve_planner_refusal_retries_total 4 (two retries per call) in /metrics:\n%s", grepLines(m, "pdserve_planner_refusal"))
	}
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
