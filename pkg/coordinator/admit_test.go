package coordinator

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/kv"
)

// TestCheckHeartbeatShape: a heartbeat whose block size differs from
// --block-tokens, or whose KV the fixed --codec cannot code, is refused
// with a reason the counter labels; auto codecs, old workers that say
// nothing, and colocated deployments (no transfers) pass.
func TestCheckHeartbeatShape(t *testing.T) {
	good := control.Heartbeat{ID: "decode-1", Role: string(control.RoleDecode), Model: "tiny", MaxSeqLen: 1024,
		KVBlocksFree: 8, KVBlocksTotal: 8, BlockTokens: 16, Codecs: []string{"none", "s2", "zstd"}}
	with := func(edit func(*control.Heartbeat)) control.Heartbeat {
		hb := good
		edit(&hb)
		return hb
	}
	base := DefaultOptions()
	tests := []struct {
		name   string
		codec  string
		mode   string
		hb     control.Heartbeat
		reason string // "" accepted
		want   string
	}{
		{"the deployment's shape", "zstd", "", good, "", ""},
		{"another block size", "", "", with(func(hb *control.Heartbeat) { hb.BlockTokens = 32 }), refusedBlockTokens, "--block-tokens 16"},
		{"an older worker says no block size", "", "", with(func(hb *control.Heartbeat) { hb.BlockTokens = 0 }), "", ""},
		{"a negative block size", "", "", with(func(hb *control.Heartbeat) { hb.BlockTokens = -16 }), refusedLimits, "block_tokens -16 is negative"},
		{"a codec its KV cannot take", "fp8", "", good, refusedCodec, "--codec fp8"},
		{"an alias of a codec it takes", "none", "", good, "", ""},
		{"auto", "auto-lossy", "", good, "", ""},
		{"no codecs said", "fp8", "", with(func(hb *control.Heartbeat) { hb.Codecs = nil }), "", ""},
		{"colocated: no transfers", "fp8", ModeColocated, with(func(hb *control.Heartbeat) { hb.Role = string(control.RoleColocated) }), "", ""},
		{"a pod address", "", "", with(func(hb *control.Heartbeat) { hb.GRPCAddr = "10.244.0.7:50051" }), "", ""},
		{"a host name: checked when dialed", "", "", with(func(hb *control.Heartbeat) { hb.GRPCAddr = "decode-0.decode:50051" }), "", ""},
		{"a public address", "", "", with(func(hb *control.Heartbeat) { hb.GRPCAddr = "203.0.113.9:50051" }), refusedNetwork, "outside --worker-networks"},
		{"the metadata service", "", "", with(func(hb *control.Heartbeat) { hb.GRPCAddr = "169.254.169.254:80" }), refusedNetwork, "outside --worker-networks"},
		{"another hash key", "", "", with(func(hb *control.Heartbeat) { hb.HashKeyID = "0123456789abcdef" }), refusedHashKey, "keyed with key 0123456789abcdef, the coordinator's with no key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.Codec = tc.codec
			if tc.mode != "" {
				o.Mode = tc.mode
			}
			reg := prometheus.NewRegistry()
			check := countingCheck(o.checkHeartbeat, reg)
			err := check(tc.hb)
			if (err != nil) != (tc.reason != "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("check: %v, want a refusal saying %q (reason %q)", err, tc.want, tc.reason)
			}
			for _, r := range []string{refusedRole, refusedLimits, refusedBlockTokens, refusedCodec, refusedModel, refusedNetwork, refusedHashKey} {
				want := 0.0
				if r == tc.reason {
					want = 1
				}
				if got := refusedCount(t, reg, r); got != want {
					t.Errorf("refusals counted for %s: %v, want %v", r, got, want)
				}
			}
		})
	}
}

// refusedCount returns the refusals of reason counted in reg.
func refusedCount(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "pdserve_coordinator_heartbeats_refused_total" && m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no counter for reason %s", reason)
	return 0
}

// TestCodecValidatedAtStart: a --codec that names no codec is an error of
// Validate, the planner on or off; a codec name, an alias, auto and
// auto-lossy are not.
func TestCodecValidatedAtStart(t *testing.T) {
	for codec, ok := range map[string]bool{"": true, "zstd": true, "f16": true, "auto": true, "auto-lossy": true, "zstdd": false, "fp16": false} {
		o := DefaultOptions()
		o.Codec = codec
		err := o.Validate()
		if (err == nil) != ok || (!ok && !strings.Contains(err.Error(), "codec")) {
			t.Errorf("--codec %q: Validate %v, want ok %v", codec, err, ok)
		}
	}
	o := DefaultOptions()
	o.BlockTokens = 0
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "block-tokens") {
		t.Errorf("--block-tokens 0: Validate %v, want an error naming it", err)
	}
}

// TestCheckHeartbeatHashKey: a keyed coordinator refuses a worker that
// hashes publicly or under another key, and takes one of its own key.
func TestCheckHeartbeatHashKey(t *testing.T) {
	o := DefaultOptions()
	o.HashKey = kv.GenerateHashKey()
	hb := control.Heartbeat{ID: "d1", Role: string(control.RoleDecode), Model: "m", KVBlocksTotal: 8, KVBlocksFree: 8}
	for _, tc := range []struct {
		name, id string
		ok       bool
	}{{"same key", o.HashKey.ID(), true}, {"public hashes", "", false}, {"another key", kv.GenerateHashKey().ID(), false}} {
		hb.HashKeyID = tc.id
		if err := o.checkHeartbeat(hb); (err == nil) != tc.ok {
			t.Errorf("%s: check = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
