package control

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// flushTimeout bounds the wait for the server to confirm a subscription.
const flushTimeout = 10 * time.Second

// WatchOption configures Watch.
type WatchOption func(*watchConfig)

type watchConfig struct {
	log   *zap.Logger
	roles []Role
	// mono is the clock Watch measures its own expiry ticks' lateness
	// on (time.Now; tests fake a pause).
	mono func() time.Time
}

// WatchRoles makes Watch subscribe to the heartbeats of roles only
// (pdserve.hb.<role>.* each) instead of every heartbeat: what a worker's
// NATS permissions let it read (see Permissions).
func WatchRoles(roles ...Role) WatchOption {
	return func(c *watchConfig) { c.roles = append(c.roles, roles...) }
}

// WatchLogger makes Watch log each heartbeat it refuses (a warning naming
// the subject, id and role; heartbeats carry no secrets).
func WatchLogger(log *zap.Logger) WatchOption {
	return func(c *watchConfig) { c.log = log }
}

// Watch feeds m with every heartbeat published on nc (or those of the
// roles of WatchRoles), observed at clock(),
// and calls m.Expire(clock()) every interval (every > 0) until ctx ends or
// stop is called; then it unsubscribes. An expiry that comes late (the
// watcher's process starved or paused: its ticker ran more than every
// after the last) first excuses every member that lateness
// (m.Excuse): heartbeats its publishers sent meanwhile may wait unread,
// so silence the watcher was not there to hear does not count. While nc is disconnected it calls
// m.Refresh(clock()) instead: no member expires while no heartbeat can
// reach the watcher. When nc is connected, it returns
// once the subscription is registered with the server, so heartbeats
// published after it are seen; when nc is still (re)connecting, the
// subscription is registered once it connects.
//
// A heartbeat is refused (dropped, and logged with WatchLogger) when it is
// not JSON, fails Validate, or its id and role differ from its subject's:
// on an authenticated server the subject is what the publisher's
// permissions vouch for (see the package doc), the payload is not. So is
// one the membership's check refuses (WithCheck), logged once per reason.
//
// stop ends the watch and waits until it has unsubscribed; it is
// idempotent and safe to call from any goroutine, also after ctx ended. Errors:
// subscription or flush errors from nats, wrapped.
func Watch(ctx context.Context, nc *nats.Conn, m *Membership, clock func() time.Time, every time.Duration, opts ...WatchOption) (stop func(), err error) {
	if every <= 0 {
		return nil, fmt.Errorf("control: watch: expiry interval %v must be positive", every)
	}
	cfg := watchConfig{log: zap.NewNop(), mono: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	handle := func(msg *nats.Msg) {
		hb, err := checkHeartbeat(msg.Subject, msg.Data)
		if err != nil {
			cfg.log.Warn("heartbeat refused", zap.String("subject", msg.Subject), zap.String("id", hb.ID), zap.String("role", hb.Role), zap.Error(err))
			return
		}
		if err := m.Observe(hb, clock()); err != nil {
			cfg.log.Warn("heartbeat refused", zap.String("subject", msg.Subject), zap.String("id", hb.ID), zap.String("role", hb.Role), zap.Error(err))
		}
	}
	subjects := []string{HeartbeatWildcard}
	if len(cfg.roles) > 0 {
		subjects = subjects[:0]
		for _, r := range cfg.roles {
			subjects = append(subjects, HeartbeatSubject(string(r), "*"))
		}
	}
	var subs []*nats.Subscription
	unsubscribe := func() {
		// Unsubscribe fails only when the subscription or the connection
		// is already closed: then nothing is left to undo.
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, subj := range subjects {
		sub, err := nc.Subscribe(subj, handle)
		if err != nil {
			unsubscribe()
			return nil, fmt.Errorf("control: watch %s: %w", subj, err)
		}
		subs = append(subs, sub)
	}
	if nc.IsConnected() {
		fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
		err := nc.FlushWithContext(fctx)
		fcancel()
		if err != nil && nc.IsConnected() {
			unsubscribe()
			return nil, fmt.Errorf("control: watch: %w", err)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer unsubscribe()
		t := time.NewTicker(every)
		defer t.Stop()
		last := cfg.mono()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				// A tick later than every: the watcher itself did not
				// run meanwhile, nor read heartbeats; its members are
				// excused that long (Membership.Excuse).
				tick := cfg.mono()
				late := tick.Sub(last) - every
				last = tick
				if nc.IsConnected() {
					now := clock()
					m.Excuse(late, now)
					m.Expire(now)
				} else {
					// Deaf, not abandoned: no heartbeat can arrive
					// while the connection is down (a NATS restart), so
					// none expires; each gets a full TTL after it.
					m.Refresh(clock())
				}
			}
		}
	})
	stop = func() {
		cancel()
		wg.Wait()
	}
	return stop, nil
}

// checkHeartbeat decodes a heartbeat received on subject. Errors:
// ErrBadHeartbeat, wrapped: not JSON, invalid, or an id or role other than
// the subject's. The heartbeat is returned as far as it decoded.
func checkHeartbeat(subject string, data []byte) (Heartbeat, error) {
	var hb Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		return hb, fmt.Errorf("%w: %w", ErrBadHeartbeat, err)
	}
	if err := hb.Validate(); err != nil {
		return hb, err
	}
	if want := HeartbeatSubject(hb.Role, hb.ID); subject != want {
		return hb, fmt.Errorf("%w: id and role say %s, sent on %s", ErrBadHeartbeat, want, subject)
	}
	return hb, nil
}
