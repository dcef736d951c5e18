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
// when it returns nil. Errors: ErrBadHeartbeat, nats.ErrConnectionClosed,
// nats.ErrMaxPayload and other publish errors, wrapped; a full reconnect
// buffer while NATS is away is not an error (the next beat retries).
func (p *Publisher) Run(ctx context.Context) error {
	if p.interval <= 0 {
		return fmt.Errorf("control: heartbeat interval %v must be positive", p.interval)
	}
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		if err := p.Publish(); err != nil && !errors.Is(err, nats.ErrReconnectBufExceeded) {
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
// starts draining tells the coordinator at once). Errors as for Run.
func (p *Publisher) Publish() error {
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
