package logging

import (
	"bufio"
	"bytes"
	"os"
	"testing"

	"go.uber.org/zap"
)

// TestLoggerNeverSamples: the binaries' logger keeps every line of a
// burst, as request lines and refusals must be (zap's production config
// would keep about 100 of each message a second).
func TestLoggerNeverSamples(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stderr
	os.Stderr = f // New writes to stderr
	l, err := New("info")
	os.Stderr = saved
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	for i := range n {
		l.Warn("request refused", zap.Int("http_status", 401), zap.Int("i", i))
		l.Info("request", zap.Int("i", i))
	}
	_ = l.Sync()
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	refused, requests := 0, 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		switch {
		case bytes.Contains(sc.Bytes(), []byte(`"msg":"request refused"`)):
			refused++
		case bytes.Contains(sc.Bytes(), []byte(`"msg":"request"`)):
			requests++
		}
	}
	if refused != n || requests != n {
		t.Errorf("%d refusal and %d request lines of %d each", refused, requests, n)
	}
}
