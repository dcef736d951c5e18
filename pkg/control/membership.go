package control

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// Membership is the coordinator's view of the workers, built from
// heartbeats. It is a deterministic core: time is an input of every call
// that depends on it. Safe for concurrent use.
type Membership struct {
	ttl time.Duration

	mu      sync.Mutex
	members map[string]member
}

type member struct {
	hb   Heartbeat
	seen time.Time // when the last heartbeat was observed, observer clock
	// unreachable: a call to the member failed as if it were gone (see
	// Unreachable); it is left out of Members until its next heartbeat.
	unreachable bool
}

// NewMembership returns an empty Membership whose members expire ttl after
// their last observed heartbeat (ttl > 0; a few heartbeat intervals).
func NewMembership(ttl time.Duration) *Membership {
	return &Membership{ttl: ttl, members: make(map[string]member)}
}

// TTL returns the expiry age.
func (m *Membership) TTL() time.Duration { return m.ttl }

// Observe records hb, observed at now (the observer's clock, not hb.Time,
// so that clock skew between machines does not matter). The latest
// observation of an id replaces the earlier one, role included. Heartbeats
// that fail Validate are ignored. hb's slices must not be modified after
// the call.
func (m *Membership) Observe(hb Heartbeat, now time.Time) {
	if hb.Validate() != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.members[hb.ID] = member{hb: hb, seen: now}
}

// Expire removes every member whose last heartbeat was observed more than
// the TTL before now, and returns their ids in ascending order (nil when
// none).
func (m *Membership) Expire(now time.Time) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var gone []string
	for id, mb := range m.members {
		if now.Sub(mb.seen) > m.ttl {
			gone = append(gone, id)
			delete(m.members, id)
		}
	}
	slices.Sort(gone)
	return gone
}

// Refresh counts every member as heard at now (a later heartbeat time is
// kept): for while the observer cannot hear heartbeats at all (its NATS
// connection is down), when silence is no sign that a worker is gone.
// Expiry resumes from now once heartbeats can arrive again.
func (m *Membership) Refresh(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, mb := range m.members {
		if now.After(mb.seen) {
			mb.seen = now
			m.members[id] = mb
		}
	}
}

// Remove drops id at once (a worker that said goodbye). Unknown ids are
// not an error.
func (m *Membership) Remove(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.members, id)
}

// Unreachable marks id, if it is a member at addr, as unreachable: a call
// to it failed as if the worker were gone (connection refused or reset),
// so Members leaves it out until its next heartbeat is observed. A dead
// worker thus stops taking requests at its first failed call rather than
// when its heartbeat expires; a live one is back within a heartbeat
// interval. It stays in All and Get, so that cleanup still finds it. A
// member since re-registered at another address is left alone.
func (m *Membership) Unreachable(id, addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mb, ok := m.members[id]; ok && mb.hb.GRPCAddr == addr {
		mb.unreachable = true
		m.members[id] = mb
	}
}

// Members returns the live members of role that are reachable and not
// draining, sorted by ID. The caller owns the returned slice; the heartbeats' own slices are
// shared and must not be modified.
func (m *Membership) Members(role Role) []Heartbeat {
	return m.list(func(mb member) bool { return mb.hb.Role == string(role) && !mb.hb.Draining && !mb.unreachable })
}

// All returns every live member, draining ones included, sorted by ID.
// Ownership as for Members.
func (m *Membership) All() []Heartbeat {
	return m.list(func(member) bool { return true })
}

func (m *Membership) list(keep func(member) bool) []Heartbeat {
	m.mu.Lock()
	out := make([]Heartbeat, 0, len(m.members))
	for _, mb := range m.members {
		if keep(mb) {
			out = append(out, mb.hb)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Heartbeat) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Get returns the last heartbeat of id, draining or not, and whether id is
// a live member.
func (m *Membership) Get(id string) (Heartbeat, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb, ok := m.members[id]
	return mb.hb, ok
}

// Model is a model the live members serve.
type Model struct {
	Name string
	// MaxSeqLen is the smallest positive MaxSeqLen the model's members
	// report (a request must fit whichever worker it is routed to), or 0
	// when none reports one.
	MaxSeqLen int
}

// Models returns the distinct non-empty model names of the live members,
// draining ones included, sorted by name, each with its smallest reported
// MaxSeqLen. The caller owns the returned slice.
func (m *Membership) Models() []Model {
	var out []Model
	for _, hb := range m.All() {
		if hb.Model == "" {
			continue
		}
		i := slices.IndexFunc(out, func(x Model) bool { return x.Name == hb.Model })
		if i < 0 {
			out = append(out, Model{Name: hb.Model})
			i = len(out) - 1
		}
		out[i].MaxSeqLen = MinSeqLen(out[i].MaxSeqLen, hb.MaxSeqLen)
	}
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// MinSeqLen returns the smaller of two sequence lengths where 0 means
// unknown: the smaller positive one, or 0 when neither is positive.
func MinSeqLen(a, b int) int {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}
