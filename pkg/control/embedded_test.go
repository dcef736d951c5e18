package control

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestStartEmbeddedAddrInUse(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	s, _, err := StartEmbedded(l.Addr().String())
	if err == nil {
		s.Shutdown()
		s.WaitForShutdown()
		t.Fatal("StartEmbedded on a taken address succeeded")
	}
	if !errors.Is(err, ErrAddrInUse) || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Errorf("error = %v, want one wrapping ErrAddrInUse that names %s", err, l.Addr())
	}
	// Told at once, not after the readiness wait.
	if d := time.Since(start); d >= embeddedReady {
		t.Errorf("took %v to fail", d)
	}
}

func TestStartEmbeddedTwoFreePorts(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	var urls []string
	for range 2 {
		s, url, err := StartEmbedded("127.0.0.1:-1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		urls = append(urls, url)
	}
	if urls[0] == urls[1] {
		t.Errorf("two servers on one URL %s", urls[0])
	}
}
