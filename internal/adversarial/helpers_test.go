package adversarial

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/apikey"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/logging"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// Keys of the tests' key files.
const (
	keyA = "sk-tenant-a-0123456789abcdef"
	keyC = "sk-tenant-c-0123456789abcdef"
)

// deployment is a standalone server (one prefill and one decode worker of
// the tiny reference engine, a 1024-token context) on a free port.
type deployment struct {
	*standalone.Server
	url string
}

// start starts a deployment with o edited by edit, logging to log (nil:
// the test's log at warn).
func start(t *testing.T, log *zap.Logger, edit func(*coordinator.Options)) *deployment {
	t.Helper()
	return startWorkers(t, log, edit, nil)
}

// startWorkers is start with each worker's options edited by worker too
// (nil: none).
func startWorkers(t *testing.T, log *zap.Logger, edit func(*coordinator.Options), worker func(*workerrun.Options)) *deployment {
	t.Helper()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone = "127.0.0.1:0", true
	if edit != nil {
		edit(&o)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	s, err := standalone.Start(context.Background(), o, log,
		standalone.WithWorkerOptions(func(wo *workerrun.Options) {
			wo.HeartbeatInterval = 20 * time.Millisecond
			if worker != nil {
				worker(wo)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	poll.CheckFor(t, 20*time.Second, 10*time.Millisecond, s.Ready)
	poll.WaitFor(t, "the model's context length", func() bool {
		ms := s.Models()
		return len(ms) > 0 && ms[0].MaxModelLen > 0
	})
	return &deployment{Server: s, url: "http://" + s.HTTPAddr()}
}

// keyFile writes a key file of lines ("KEY name=N tpm=T tenant=X"), returning its
// path.
func keyFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, path, lines...)
	return path
}

func writeKeys(t *testing.T, path string, lines ...string) {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		f := strings.Fields(l)
		name, tpm, tenant := "", 0, ""
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "name":
				name = v
			case "tpm":
				tpm = atoi(t, v)
			case "tenant":
				tenant = " tenant=" + v
			}
		}
		line, err := apikey.FormatLine(f[0], name, 0, tpm)
		if err != nil {
			t.Fatal(err)
		}
		line += tenant
		b.WriteString(line + "\n")
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func atoi(t *testing.T, s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a number: %q", s)
		}
		n = 10*n + int(c-'0')
	}
	return n
}

// reply is a response read whole.
type reply struct {
	status int
	header http.Header
	body   string
}

// post sends body to path with key (none when "").
func (d *deployment) post(t *testing.T, path, key string, body io.Reader) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// counter returns the sum of the counter name's series in g, 0 when
// absent.
func counter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	return metricSum(t, g, name, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// gauge returns the sum of the gauge name's series in g.
func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	return metricSum(t, g, name, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

// metricSum returns the sum of value over the series of name in g.
func metricSum(t *testing.T, g prometheus.Gatherer, name string, value func(*dto.Metric) float64) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += value(m)
			}
		}
	}
	return sum
}

// heapObjects returns the bytes of heap objects, live and not yet swept.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// heapPeak samples the heap every millisecond while f runs and returns
// the peak over the heap before it (after a collection).
//
// The heap's objects include garbage not yet collected, up to GOGC% of
// the live heap at the default pacing: more, the longer f takes, from
// the deployment's background work (heartbeats, metrics) too. So the
// collector runs at GOGC=5 meanwhile, and the peak is that of the live
// heap within 5%, however long a loaded machine makes f take.
func heapPeak(f func()) uint64 {
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	runtime.GC()
	base := heapObjects()
	stop, done := make(chan struct{}), make(chan uint64)
	go func() {
		var peak uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if h := heapObjects(); h > peak {
				peak = h
			}
			select {
			case <-stop:
				done <- peak
				return
			case <-t.C:
			}
		}
	}()
	f()
	close(stop)
	peak := <-done
	if peak < base {
		return 0
	}
	return peak - base
}

// binaryLogger returns the binaries' logger (logging.New, which
// writes JSON to stderr), writing into a scratch file instead, and a
// function that counts the lines logged so far whose message is msg.
func binaryLogger(t *testing.T) (*zap.Logger, func(msg string) int) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	saved := os.Stderr
	os.Stderr = f // logging.New writes to stderr
	log, err := logging.New("info")
	os.Stderr = saved
	if err != nil {
		t.Fatal(err)
	}
	return log, func(msg string) int {
		_ = log.Sync()
		data, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), []byte(`"msg":"`+msg+`"`)) {
				n++
			}
		}
		return n
	}
}
