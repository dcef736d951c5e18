package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Publisher publishes one worker's heartbeat on
// "pdserve.hb.<role>.<id>" every interval. Safe for concurrent use.
type Publisher struct {
	nc       *nats.Conn
	interval time.Duration
	snapshot func() Heartbeat
	now      func() time.Time
}

// NewPublisher returns a Publisher that takes each heartbeat from snapshot
// (called from Run's goroutine, or Publish's caller; it must be safe for
// that) and publishes it on nc every interval (> 0). A heartbeat with a
// zero Time gets the publisher's time.Now.
func NewPublisher(nc *nats.Conn, interval time.Duration, snapshot func() Heartbeat) *Publisher {
	return &Publisher{nc: nc, interval: interval, snapshot: snapshot, now: time.Now}
}

// Run publishes a heartbeat at once and then every interval until ctx ends,
// when it returns nil; beats fall while nc is not connected (see
// Publish). Errors: ErrBadHeartbeat, nats.ErrConnectionClosed,
// nats.ErrMaxPayload and other publish errors, wrapped; a full reconnect
// buffer while NATS is away is not an error (the next beat retries), nor
// is any error once ctx has ended (a worker closing its connection).
func (p *Publisher) Run(ctx context.Context) error {
	if p.interval <= 0 {
		return fmt.Errorf("control: heartbeat interval %v must be positive", p.interval)
	}
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		if err := p.Publish(); err != nil && !errors.Is(err, nats.ErrReconnectBufExceeded) {
			if ctx.Err() != nil {
				return nil // the connection closed as the publisher stopped
			}
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Publish publishes one heartbeat now, outside the interval (a worker that
// starts draining tells the coordinator at once). While nc is not
// connected (a NATS server not up yet, a reconnect) it publishes nothing
// and returns nil: a heartbeat buffered then would reach the coordinator
// late, claiming a state long gone. Errors as for Run.
func (p *Publisher) Publish() error {
	if !p.nc.IsConnected() {
		return nil
	}
	hb := p.snapshot()
	if hb.Time.IsZero() {
		hb.Time = p.now()
	}
	if err := hb.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(hb)
	if err != nil {
		return fmt.Errorf("control: heartbeat %s: %w", hb.ID, err)
	}
	if err := p.nc.Publish(HeartbeatSubject(hb.Role, hb.ID), data); err != nil {
		return fmt.Errorf("control: publish heartbeat %s: %w", hb.ID, err)
	}
	return nil
}
