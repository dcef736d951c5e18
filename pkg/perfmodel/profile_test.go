package perfmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
)

// The profiles the issue requires; more may ship.
var requiredProfiles = []string{
	"a100-80g/opt-13b/tp1", "a100-80g/opt-13b/tp2", "a100-80g/opt-13b/tp4",
	"a100-80g/opt-66b/tp2", "a100-80g/opt-66b/tp4", "a100-80g/opt-66b/tp8",
	"a100-80g/llama-2-70b/tp2", "h100/llama-2-70b/tp2",
	"h100/llama-3-8b/tp1", "h200/llama-3-8b/tp1",
	"h100/llama-3-70b/tp4", "h200/llama-3-70b/tp4",
}

func mustLoad(t *testing.T, name string) *Profile {
	t.Helper()
	p, err := Load(name)
	if err != nil {
		t.Fatalf("Load(%q): %v", name, err)
	}
	return p
}

func TestNamesHoldRequiredProfiles(t *testing.T) {
	names := Names()
	have := make(map[string]bool, len(names))
	for _, n := range names {
		have[n] = true
	}
	for _, want := range requiredProfiles {
		if !have[want] {
			t.Errorf("Names() lacks %q; have %v", want, names)
		}
	}
}

func TestEveryProfileLoadsAndRecordsItsSource(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p := mustLoad(t, name)
			if p.Name != name {
				t.Errorf("Name = %q, want %q", p.Name, name)
			}
			if p.Source == "" || p.Calibration == "" {
				t.Errorf("Source %q / Calibration %q: both must be recorded", p.Source, p.Calibration)
			}
			if p.Tolerance <= 0 || p.Tolerance > 0.15 {
				t.Errorf("Tolerance = %v, want in (0, 0.15]", p.Tolerance)
			}
			asserted := 0
			for _, pt := range p.Points {
				if pt.Check != CheckReference {
					asserted++
				}
			}
			if asserted == 0 {
				t.Errorf("no exact or fit point: the profile is calibrated against nothing")
			}
			if p.MaxKVTokens() <= 0 {
				t.Errorf("MaxKVTokens = %d: the model does not fit the GPUs", p.MaxKVTokens())
			}
		})
	}
}

// TestProfilesReproduceTheirSourcePoints is the calibration check: DistServe
// profiles reproduce DistServe's formula exactly, measured points lie within
// the profile's tolerance (≤ 15% for every shipped profile).
func TestProfilesReproduceTheirSourcePoints(t *testing.T) {
	for _, name := range Names() {
		p := mustLoad(t, name)
		rows, err := p.Calibrate()
		if err != nil {
			t.Fatalf("%s: Calibrate: %v", name, err)
		}
		for _, r := range rows {
			t.Run(name+"/"+r.Point, func(t *testing.T) {
				if !r.OK() {
					t.Errorf("%s: model %.6g, source %.6g: relative error %+.3g%% beyond %s limit %.3g%%",
						r.Metric, r.Model, r.Source, 100*r.RelErr, r.Check, 100*r.Limit)
				}
			})
		}
	}
}

// distServeFormula is DistServe's estimator written out independently of
// StepSeconds: prefill a + b·Σl + c·Σl², decode a + b·Σn + c·B, in ms.
func distServeFormula(d *DistServe, prefill []int, decode []int) float64 {
	if len(prefill) > 0 {
		var sum, sq float64
		for _, l := range prefill {
			sum += float64(l)
			sq += float64(l * l)
		}
		return d.Prefill[0] + d.Prefill[1]*sum + d.Prefill[2]*sq
	}
	k := d.DecodeSmall
	if len(decode) >= d.LargeBatchThreshold {
		k = d.DecodeLarge
	}
	var sum float64
	for _, n := range decode {
		sum += float64(n)
	}
	return k[0] + k[1]*sum + k[2]*float64(len(decode))
}

func TestDistServePointsAreTheFormula(t *testing.T) {
	for _, name := range Names() {
		p := mustLoad(t, name)
		if p.Form != FormDistServe {
			continue
		}
		for _, pt := range p.Points {
			if pt.Metric != MetricStepMs {
				continue
			}
			b := pt.Batch()
			want := distServeFormula(p.DistServe, b.Prefill, b.Decode)
			if rel := math.Abs(pt.Value-want) / want; rel > 1e-12 {
				t.Errorf("%s %q: recorded source %v, DistServe's formula gives %v", name, pt.Name, pt.Value, want)
			}
			if pt.Check != CheckExact {
				t.Errorf("%s %q: check %q, want exact for a formula point", name, pt.Name, pt.Check)
			}
			got := float64(p.StepTime(b)) / 1e6
			if math.Abs(got-want) > 1e-6 { // StepTime rounds to the nanosecond
				t.Errorf("%s %q: StepTime %v ms, formula %v ms", name, pt.Name, got, want)
			}
		}
	}
}

// TestDistServeCoefficientsMatchSourceFile compares the embedded
// coefficients with DistServe's published file in the shared data
// directory (../shared/data beside the repository), when it is there.
func TestDistServeCoefficientsMatchSourceFile(t *testing.T) {
	dir := repotest.SharedData(t)
	data, err := os.ReadFile(filepath.Join(dir, "perf-profiles", "distserve-a100-80g.distserve.json"))
	if err != nil {
		t.Skipf("DistServe source file not available: %v", err)
	}
	type entry struct {
		Threshold int        `json:"decoding_large_small_bs_threshold"`
		Prefill   [3]float64 `json:"prefill"`
		Small     [3]float64 `json:"decoding_smallbs"`
		Large     [3]float64 `json:"decoding_largebs"`
	}
	var src map[string]map[string]entry
	if err := json.Unmarshal(data, &src); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range Names() {
		p := mustLoad(t, name)
		if p.Form != FormDistServe {
			continue
		}
		e, ok := src["facebook/"+p.Model][strings.TrimPrefix(name[strings.LastIndex(name, "/")+1:], "tp")]
		if !ok {
			t.Errorf("%s: no entry in DistServe's file", name)
			continue
		}
		want := DistServe{Prefill: e.Prefill, DecodeSmall: e.Small, DecodeLarge: e.Large, LargeBatchThreshold: e.Threshold}
		if diff := cmp.Diff(want, *p.DistServe); diff != "" {
			t.Errorf("%s: coefficients differ from DistServe's (-source +embedded):\n%s", name, diff)
		}
		checked++
	}
	if checked < 6 {
		t.Errorf("checked %d DistServe profiles, want ≥ 6", checked)
	}
}

func TestKVBytesPerTokenIsTheModelsTrueSize(t *testing.T) {
	// Published sizes (bf16): Llama-3-8B 128 KiB, Llama-3-70B 320 KiB,
	// OPT-13B 800 KiB, OPT-66B 2.25 MiB per token.
	published := map[string]int64{
		"opt-13b": 819200, "opt-66b": 2359296, "llama-3-8b": 131072,
		"llama-3-70b": 327680, "llama-2-70b": 327680,
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p := mustLoad(t, name)
			s := p.Spec
			want := int64(2 * s.Layers * s.KVHeads * s.HeadDim * 2)
			if got := p.KVBytesPerToken(); got != want {
				t.Errorf("KVBytesPerToken = %d, want 2·%d·%d·%d·2 = %d", got, s.Layers, s.KVHeads, s.HeadDim, want)
			}
			if pub, ok := published[p.Model]; ok && want != pub {
				t.Errorf("%s: 2·layers·kv_heads·head_dim·2 = %d, published %d", p.Model, want, pub)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	for _, name := range []string{"", "h100", "h100/llama-3-8b", "h100/llama-3-8b/tp3", "../profiles/x/y", "a/b/c/d"} {
		if _, err := Load(name); !errors.Is(err, ErrUnknownProfile) {
			t.Errorf("Load(%q) = %v, want ErrUnknownProfile", name, err)
		}
	}
}

func TestLoadFile(t *testing.T) {
	base := mustLoad(t, "h100/llama-3-8b/tp1")
	data, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		t.Helper()
		fn := filepath.Join(dir, name)
		if err := os.WriteFile(fn, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return fn
	}

	good := write("good.json", data)
	got, err := LoadFile(good)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	if diff := cmp.Diff(base, got); diff != "" {
		t.Errorf("LoadFile of a marshalled profile differs (-want +got):\n%s", diff)
	}
	if r, err := Resolve(good); err != nil || r.Name != base.Name {
		t.Errorf("Resolve(file) = %v, %v", r, err)
	}
	for _, name := range []string{"h100/llama-3-8b/tp1", "H100/Llama-3-8B/TP1"} {
		if r, err := Resolve(name); err != nil || r.Name != base.Name {
			t.Errorf("Resolve(%q) = %v, %v", name, r, err)
		}
	}

	mutate := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	bad := map[string][]byte{
		"unknown field":     mutate(func(m map[string]any) { m["roofline"].(map[string]any)["compute_eff"] = 0.5 }),
		"name mismatch":     mutate(func(m map[string]any) { m["name"] = "h100/llama-3-8b/tp2" }),
		"efficiency > 1":    mutate(func(m map[string]any) { m["roofline"].(map[string]any)["memory_efficiency"] = 1.5 }),
		"overlap < 1":       mutate(func(m map[string]any) { m["roofline"].(map[string]any)["overlap"] = 0.5 }),
		"missing form data": mutate(func(m map[string]any) { delete(m, "roofline") }),
		"unknown form":      mutate(func(m map[string]any) { m["form"] = "guess" }),
		"no source":         mutate(func(m map[string]any) { m["source"] = "" }),
		"kv heads":          mutate(func(m map[string]any) { m["spec"].(map[string]any)["kv_heads"] = 5 }),
		"bad point metric":  mutate(func(m map[string]any) { m["points"].([]any)[0].(map[string]any)["metric"] = "speed" }),
		"empty point": mutate(func(m map[string]any) {
			m["points"] = []any{map[string]any{"name": "x", "metric": "step_ms", "value": 1, "check": "fit"}}
		}),
		"not json": []byte("{"),
	}
	for name, data := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := LoadFile(write(strings.ReplaceAll(name, " ", "_")+".json", data)); !errors.Is(err, ErrInvalidProfile) {
				t.Errorf("LoadFile = %v, want ErrInvalidProfile", err)
			}
		})
	}
	if _, err := LoadFile(filepath.Join(dir, "absent.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(absent) = %v, want ErrNotExist", err)
	}
}

func TestWriteCalibrationReport(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteCalibrationReport(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Contains(out, "FAIL") {
		t.Errorf("report has failing rows:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := 1 // header
	for _, name := range Names() {
		want += len(mustLoad(t, name).Points)
		if !strings.Contains(out, name) {
			t.Errorf("report lacks profile %s", name)
		}
	}
	if len(lines) != want {
		t.Errorf("report has %d lines, want %d (header + one per point)", len(lines), want)
	}
	if !strings.HasPrefix(lines[0], "PROFILE") || !strings.Contains(lines[0], "REL.ERR") {
		t.Errorf("header = %q", lines[0])
	}
}

func TestWriteProfiles(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteProfiles(&buf); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	names := Names()
	if len(lines) != len(names)+1 {
		t.Fatalf("got %d lines, want header + %d profiles:\n%s", len(lines), len(names), buf.String())
	}
	for i, name := range names {
		if !strings.HasPrefix(lines[i+1], name+" ") {
			t.Errorf("line %d = %q, want it to start with %s", i+1, lines[i+1], name)
		}
	}
	if !strings.Contains(buf.String(), "DistServe (Zhong et al., OSDI'24) fitted latency model") {
		t.Errorf("source citations missing:\n%s", buf.String())
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWritersReturnWriteErrors(t *testing.T) {
	if err := WriteProfiles(failWriter{}); err == nil {
		t.Error("WriteProfiles: want the write error")
	}
	if err := WriteCalibrationReport(failWriter{}); err == nil {
		t.Error("WriteCalibrationReport: want the write error")
	}
}
