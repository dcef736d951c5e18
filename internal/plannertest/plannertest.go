// Package plannertest holds what the online planner's tests share: the
// coordinator's (pkg/coordinator) and the planner host's
// (pkg/plannerhost): a fast performance-model engine, an SLO policy file
// and a log-field reader.
package plannertest

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// Profile is the performance-model profile the tests plan on.
const Profile = "h100/llama-3-8b/tp1"

// SimEngine is the performance-model engine on Profile, a thousand times
// faster than the profile's GPU, with a hundredth of its KV bytes.
func SimEngine() enginecfg.Options {
	return enginecfg.Options{Engine: enginecfg.Sim, Profile: Profile, TimeScale: 0.001, PayloadScale: 0.01, Seed: 3}
}

// SLOPolicy writes a policy file with TTFT and TPOT targets (500 ms,
// 50 ms, 90%) and returns its path.
func SLOPolicy(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte("slo: {ttft_ms: 500, tpot_ms: 50, attainment: 0.9}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// LogField returns the string value of the log field key, or "".
func LogField(fields []zapcore.Field, key string) string {
	for _, f := range fields {
		if f.Key == key {
			return f.String
		}
	}
	return ""
}
