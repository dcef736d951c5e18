package control

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// flushTimeout bounds the wait for the server to confirm a subscription.
const flushTimeout = 10 * time.Second

// Watch feeds m with every heartbeat published on nc, observed at clock(),
// and calls m.Expire(clock()) every interval (every > 0) until ctx ends or
// stop is called; then it unsubscribes. It returns once the subscription is
// registered with the server, so heartbeats published after it are seen.
// Malformed heartbeats are dropped.
//
// stop ends the watch and waits until it has unsubscribed; it is
// idempotent and safe to call from any goroutine, also after ctx ended. Errors:
// subscription or flush errors from nats, wrapped.
func Watch(ctx context.Context, nc *nats.Conn, m *Membership, clock func() time.Time, every time.Duration) (stop func(), err error) {
	if every <= 0 {
		return nil, fmt.Errorf("control: watch: expiry interval %v must be positive", every)
	}
	sub, err := nc.Subscribe(HeartbeatWildcard, func(msg *nats.Msg) {
		var hb Heartbeat
		if json.Unmarshal(msg.Data, &hb) != nil {
			return
		}
		m.Observe(hb, clock())
	})
	if err != nil {
		return nil, fmt.Errorf("control: watch: %w", err)
	}
	fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
	err = nc.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("control: watch: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		// Unsubscribe fails only when the subscription or the connection
		// is already closed: then nothing is left to undo.
		defer func() { _ = sub.Unsubscribe() }()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				m.Expire(clock())
			}
		}
	})
	stop = func() {
		cancel()
		wg.Wait()
	}
	return stop, nil
}
