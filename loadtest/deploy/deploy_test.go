package deploy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/pkg/workload"
)

func TestGPUs(t *testing.T) {
	for _, tc := range []struct {
		spec deploy.Spec
		want int
	}{
		{deploy.Spec{Mode: deploy.Disaggregated, Profile: "a100-80g/opt-13b/tp1", PrefillWorkers: 2, DecodeWorkers: 1}, 3},
		{deploy.Spec{Mode: deploy.Colocated, Profile: "a100-80g/opt-13b/tp1", DecodeWorkers: 3}, 3},
		{deploy.Spec{Mode: deploy.Colocated, Profile: "x/y/tp4", DecodeWorkers: 2}, 8},
		{deploy.Spec{Mode: deploy.Colocated, Engine: "ref", DecodeWorkers: 2}, 2},
	} {
		got, err := tc.spec.GPUs()
		if err != nil || got != tc.want {
			t.Errorf("%+v: %d GPUs, %v; want %d", tc.spec, got, err, tc.want)
		}
	}
	if _, err := (deploy.Spec{Mode: deploy.Colocated, Profile: "nonsense", DecodeWorkers: 1}).GPUs(); !errors.Is(err, deploy.ErrSpec) {
		t.Errorf("unknown profile: got %v, want ErrSpec", err)
	}
}

func TestFacts(t *testing.T) {
	d := deploy.Spec{Mode: deploy.Disaggregated, Profile: "a100-80g/opt-13b/tp1", PrefillWorkers: 2, DecodeWorkers: 1, Codec: "zstd", LinkGbps: 25}
	f := d.Facts()
	for k, want := range map[string]string{
		"engine":             "sim a100-80g/opt-13b/tp1 (time scale 1, KV payload scale 1)",
		"P:D split":          "2:1",
		"KV codec / link":    "zstd, 25 Gb/s",
		"first-token policy": "prefill",
	} {
		if v, _ := f.Get(k); v != want {
			t.Errorf("%s = %v, want %q", k, v, want)
		}
	}
	c := deploy.Spec{Mode: deploy.Colocated, Engine: "ref", Preset: "tiny", DecodeWorkers: 3, ChunkTokens: 256, MaxBatchTokens: 1024}
	if v, _ := c.Facts().Get("step budget"); v != "chunked prefill: 256-token chunks, 1024 tokens/step, ≤ 64 seqs/step" {
		t.Errorf("colocated step budget %q", v)
	}
}

// TestStartServes starts small deployments on the reference engine and
// sends a request to each.
func TestStartServes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts deployments")
	}
	w, err := workload.Random(workload.RandomOptions{InputLen: 16, OutputLen: 4}, 1, 1, workload.Synth{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []deploy.Spec{
		{Mode: deploy.Colocated, Engine: "ref", Preset: "tiny", DecodeWorkers: 1},
		{Mode: deploy.Disaggregated, Engine: "ref", Preset: "tiny", PrefillWorkers: 1, DecodeWorkers: 1, Codec: "zstd"},
		{Mode: deploy.Disaggregated, Profile: "a100-80g/opt-13b/tp1", PayloadScale: 1.0 / 1024, PrefillWorkers: 1, DecodeWorkers: 1, LinkGbps: 100},
	} {
		t.Run(s.Mode+"/"+s.Engine+s.Profile, func(t *testing.T) {
			ctx := context.Background()
			l, err := deploy.Start(ctx, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := l.Close(ctx); err != nil {
					t.Error(err)
				}
			}()
			c, err := client.New(client.Options{BaseURL: l.URL(), IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			o := c.Do(ctx, &w.Requests[0])
			if !o.Success || o.OutputTokens != 4 {
				t.Fatalf("outcome: success %v, %d tokens, error %q", o.Success, o.OutputTokens, o.Error)
			}
			if o.Budget == nil || o.Budget["mode"] != s.Mode {
				t.Errorf("budget %v, want mode %s", o.Budget, s.Mode)
			}
		})
	}
}
