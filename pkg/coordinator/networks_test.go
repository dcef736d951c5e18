package coordinator

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

// TestWorkerNetworks: the defaults by mode, the flag's validation, and
// the dialer, which connects inside the networks (a name resolved) and
// refuses outside them without a connection attempt.
func TestWorkerNetworks(t *testing.T) {
	o := DefaultOptions()
	if got := o.workerNetworks(); got != DefaultWorkerNetworks {
		t.Errorf("default %q", got)
	}
	o.Standalone = true
	if got := o.workerNetworks(); got != StandaloneWorkerNetworks {
		t.Errorf("standalone default %q", got)
	}
	for _, bad := range []string{"10.0.0.0/33", "nonsense", " , "} {
		o := DefaultOptions()
		o.WorkerNetworks = bad
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "worker-networks") {
			t.Errorf("--worker-networks %q: Validate %v, want an error naming it", bad, err)
		}
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	loop, _ := parseNetworks(StandaloneWorkerNetworks)
	private, _ := parseNetworks("10.0.0.0/8")
	ctx := context.Background()
	for _, addr := range []string{lis.Addr().String(), net.JoinHostPort("localhost", port)} {
		c, err := loop.dial(ctx, addr)
		if err != nil {
			t.Fatalf("dial %s inside loopback: %v", addr, err)
		}
		c.Close()
		<-accepted
	}
	if _, err := private.dial(ctx, lis.Addr().String()); !errors.Is(err, errOutsideNetworks) {
		t.Errorf("dial loopback with only 10.0.0.0/8: %v, want errOutsideNetworks", err)
	}
	select {
	case <-accepted:
		t.Error("a connection outside the networks reached the listener")
	default:
	}
}
