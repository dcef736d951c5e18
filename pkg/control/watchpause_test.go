package control

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/poll"
)

// pauseClock is Watch's two clocks, wall (the observer's) and mono (its
// ticks' lateness), faked together: a pause moves both at the next
// expiry tick's first read (mono), so that one tick sees all of it.
type pauseClock struct {
	mu         sync.Mutex
	wall, mono time.Time
	pause      time.Duration // applied at the next Mono
	ticks      int           // Mono reads
}

func (c *pauseClock) Mono() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall, c.mono, c.pause = c.wall.Add(c.pause), c.mono.Add(c.pause), 0
	c.ticks++
	return c.mono
}

func (c *pauseClock) Wall() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

func (c *pauseClock) Ticks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ticks
}

// Pause makes the watcher's next tick come d late, d of wall time later.
func (c *pauseClock) Pause(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pause += d
}

// AdvanceWall moves the observer's clock alone: time the watcher watched.
func (c *pauseClock) AdvanceWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
}

// onTime makes Watch take its expiry ticks as on time, for a test whose
// fake observer clock says how much time the watcher watched: real ticks
// late under load would otherwise excuse members that time (the fake
// clock, frozen after a jump, never gives it back).
func onTime(w *watchConfig) { w.mono = func() time.Time { return time.Time{} } }

// TestWatchExcusesItsOwnPause: an expiry tick that comes long after the
// one before (the watcher's process starved of CPU, or paused) does not
// expire a member whose silence fell in that pause, since the watcher
// did not read heartbeats then either (in a loaded test run a starved
// coordinator dropped every worker at once: 503 no_workers). A member
// silent for a TTL while the watcher ran on time still expires. Without
// Membership.Excuse the first tick after the pause expires the member.
func TestWatchExcusesItsOwnPause(t *testing.T) {
	nc := startNATS(t)
	c := &pauseClock{wall: time.Unix(1000, 0), mono: time.Unix(0, 0)}
	ttl := 5 * time.Second
	m := NewMembership(ttl)
	if err := m.Observe(Heartbeat{ID: "p1", Role: string(RolePrefill), GRPCAddr: "a:1"}, c.Wall()); err != nil {
		t.Fatal(err)
	}
	stop, err := Watch(context.Background(), nc, m, c.Wall, time.Millisecond, func(w *watchConfig) { w.mono = c.Mono })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// The watcher reads mono when it starts, then at every tick.
	poll.WaitFor(t, "the watcher ticking", func() bool { return c.Ticks() >= 2 })
	n := c.Ticks()
	c.Pause(3 * ttl)
	poll.WaitFor(t, "expiry ticks after the pause", func() bool { return c.Ticks() >= n+3 })
	if _, ok := m.Get("p1"); !ok {
		t.Fatal("member expired by the watcher's own pause")
	}

	c.AdvanceWall(ttl + time.Second)
	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if _, ok := m.Get("p1"); ok {
			return errors.New("member not expired a TTL of watched silence after its last heartbeat")
		}
		return nil
	})
}
