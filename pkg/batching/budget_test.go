package batching

import (
	"flag"
	"io"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
)

// TestBudgetFlags: the flags set the budget, defaults first; Validate
// names each non-positive field's flag; LogFields names both settings.
func TestBudgetFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    Budget
		wantErr []string // substrings; nil: valid
	}{
		{nil, Budget{512, 2048}, nil},
		{[]string{"--chunk-tokens=16", "--max-batch-tokens=64"}, Budget{16, 64}, nil},
		{[]string{"--chunk-tokens=0"}, Budget{0, 2048}, []string{"chunk-tokens 0 must be positive"}},
		{[]string{"--chunk-tokens=-1", "--max-batch-tokens=0"}, Budget{-1, 0},
			[]string{"chunk-tokens -1 must be positive", "max-batch-tokens 0 must be positive"}},
	} {
		b := DefaultBudget()
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		b.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if b != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.args, b, tc.want)
		}
		err := b.Validate()
		if (err != nil) != (tc.wantErr != nil) {
			t.Errorf("%q: Validate() = %v", tc.args, err)
		}
		for _, w := range tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: Validate() = %v, want %q", tc.args, err, w)
			}
		}
		enc := zapcore.NewMapObjectEncoder()
		for _, f := range b.LogFields() {
			f.AddTo(enc)
		}
		if enc.Fields["chunk_tokens"] != int64(b.ChunkTokens) || enc.Fields["max_batch_tokens"] != int64(b.MaxBatchTokens) {
			t.Errorf("%q: LogFields %v", tc.args, enc.Fields)
		}
	}
}
