package decode

import (
	"errors"
	"testing"
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
)

// TestServiceNeverWaitsForReceiver: the service does not hold its lock
// across a call into the KV receiver. With the receiver's lock held (a
// receiver busy with a transfer), a Reserve makes its reservation and
// then waits for the receiver holding no lock of the service: Server.mu
// is free while the reservation exists and the call has not returned.
// On the old code Reserve handed the reservation to the receiver
// holding Server.mu (rxState.expect under mu), so mu stayed held: every
// other call of the service waited for the receiver.
func TestServiceNeverWaitsForReceiver(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	w.s.rx.mu.Lock()
	locked := true
	defer func() {
		if locked {
			w.s.rx.mu.Unlock()
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := w.client.Reserve(testCtx(t), &pdservev1.ReserveRequest{RequestId: "r", Tokens: 32})
		done <- err
	}()
	poll.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
		if !w.s.mu.TryLock() {
			return errors.New("Server.mu is held")
		}
		defer w.s.mu.Unlock()
		if w.s.seqs["r"] == nil {
			return errors.New("not reserved yet")
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("Reserve returned (%v) before the receiver heard of the reservation", err)
	default:
	}
	w.s.rx.mu.Unlock()
	locked = false
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
