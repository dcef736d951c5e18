package charttest

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// otelArgs returns, per pdserve container of the release (coordinator,
// prefill-worker, decode-worker), its --otel-* arguments.
func otelArgs(t *testing.T, rel release) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for pod, spec := range rel.podSpecs() {
		for _, c := range spec.Containers {
			if _, ok := binaries[c.Name]; !ok {
				continue
			}
			var got []string
			for _, a := range slices.Concat(c.Command, c.Args) {
				if strings.HasPrefix(a, "--otel-") {
					got = append(got, a)
				}
			}
			out[pod+"/"+c.Name] = got
		}
	}
	return out
}

// TestTracingValues: tracing is off in the chart's defaults (no --otel
// flag on any binary), and tracing.endpoint, protocol and sampleRatio
// reach the coordinator and both pools alike (the flag sets of the
// binaries accept them: TestFlagsParse covers every values set).
func TestTracingValues(t *testing.T) {
	for pod, args := range otelArgs(t, render(t, valuesSet{name: "defaults"})) {
		if len(args) > 0 {
			t.Errorf("defaults: %s has %v, want no trace flags", pod, args)
		}
	}
	var set valuesSet
	for _, vs := range valuesSets(t) {
		if vs.name == "observability" {
			set = vs
		}
	}
	if set.file == "" {
		t.Fatal("no ci/observability-values.yaml")
	}
	got := otelArgs(t, render(t, set))
	want := []string{"--otel-endpoint=http://otel-collector.observability:4317", "--otel-protocol=grpc", "--otel-sample-ratio=0.25"}
	containers := map[string]bool{}
	for pod, args := range got {
		containers[pod[strings.LastIndex(pod, "/")+1:]] = true
		if diff := cmp.Diff(want, args); diff != "" {
			t.Errorf("observability: %s trace flags (-want +got):\n%s", pod, diff)
		}
	}
	for _, c := range []string{"coordinator", "prefill-worker", "decode-worker"} {
		if !containers[c] {
			t.Errorf("observability: no %s container rendered", c)
		}
	}
}
