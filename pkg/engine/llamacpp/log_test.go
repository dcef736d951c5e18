package llamacpp

import (
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/repotest"
)

// observe routes llama.cpp's log to an observer of every level until the
// test ends.
func observe(t *testing.T) *observer.ObservedLogs {
	core, logs := observer.New(zapcore.DebugLevel)
	SetLogger(zap.New(core))
	t.Cleanup(func() { SetLogger(nil) })
	return logs
}

func cString(s string) *byte { return &append([]byte(s), 0)[0] }

// TestLogLevels: errors at error level, warnings and everything else at
// debug, a continuation at the level of the line it continues.
func TestLogLevels(t *testing.T) {
	logs := observe(t)
	for _, l := range []struct {
		level int32
		text  string
	}{
		{2, "llama_model_loader: loaded meta data\n"},
		{3, "load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden\n"},
		{5, "continued warning\n"},
		{4, "llama_model_load: error loading model\n"},
		{5, "continued error"},
		{1, "debug line\n"},
		{5, "\n"}, // an empty line is dropped
	} {
		logFromC(l.level, cString(l.text), 0)
	}
	type entry struct {
		level zapcore.Level
		msg   string
	}
	want := []entry{
		{zapcore.DebugLevel, "llama_model_loader: loaded meta data"},
		{zapcore.DebugLevel, "load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden"},
		{zapcore.DebugLevel, "continued warning"},
		{zapcore.ErrorLevel, "llama_model_load: error loading model"},
		{zapcore.ErrorLevel, "continued error"},
		{zapcore.DebugLevel, "debug line"},
	}
	got := logs.AllUntimed()
	if len(got) != len(want) {
		t.Fatalf("%d log entries, want %d: %v", len(got), len(want), got)
	}
	for i, e := range got {
		if e.Level != want[i].level || e.Message != want[i].msg || e.LoggerName != "llama.cpp" {
			t.Errorf("entry %d: %s %q (logger %q), want %s %q (logger llama.cpp)", i, e.Level, e.Message, e.LoggerName, want[i].level, want[i].msg)
		}
	}
}

// TestLoadLogsNoWarnings: loading the qwen2 vocabulary, whose load makes
// llama.cpp warn of control-looking tokens, logs nothing above debug.
func TestLoadLogsNoWarnings(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	logs := observe(t)
	m, err := LoadModel(filepath.Join(vocab, "ggml-vocab-qwen2.gguf"), LoadOptions{LibDir: lib, VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	control := 0
	for _, e := range logs.AllUntimed() {
		if e.Level > zapcore.DebugLevel {
			t.Errorf("llama.cpp logged at %s: %q", e.Level, e.Message)
		}
		if strings.Contains(e.Message, "control-looking token") {
			control++
		}
	}
	if control == 0 {
		t.Errorf("no control-looking token line among %d debug lines: the load did not go through the log callback", logs.Len())
	}
}
