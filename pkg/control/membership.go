package control

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Membership is the coordinator's view of the workers, built from
// heartbeats. It is a deterministic core: time is an input of every call
// that depends on it. Safe for concurrent use.
type Membership struct {
	ttl   time.Duration
	admit bool // members need Admit before Members and Models list them
	// moves: an admitted elastic member that changes role at the same
	// address stays admitted (AdmitRoleMoves).
	moves bool
	check func(hb Heartbeat) error // refuses heartbeats; nil: none
	// maxPending bounds the members not admitted yet (with admit); 0:
	// no bound.
	maxPending int

	mu      sync.Mutex
	members map[string]member
	refused map[string]string // id → the reason its last heartbeat was refused
	// pendingRefused counts heartbeats of new ids refused for a full
	// pending set.
	pendingRefused uint64
}

type member struct {
	hb   Heartbeat
	seen time.Time // when the last heartbeat was observed, observer clock
	// unreachable: a call to the member failed as if it were gone (see
	// Unreachable), at unreachableAt (observer clock); it is left out of
	// Members until its next heartbeat observed UnreachableGrace later.
	unreachable   bool
	unreachableAt time.Time
	// admitted: Admit was called for the member's id, role and address.
	admitted bool
}

// MembershipOption configures a Membership.
type MembershipOption func(*Membership)

// RequireAdmission makes a member count (in Members and Models) only once
// Admit admitted it: the observer verified the worker behind the
// heartbeat (the coordinator's authenticated health call). A member
// whose role or address changes needs admitting again (see
// AdmitRoleMoves).
func RequireAdmission() MembershipOption { return func(m *Membership) { m.admit = true } }

// AdmitRoleMoves keeps a member admitted (with RequireAdmission) when its
// role changes and its address does not, when the heartbeats before and
// after the change both say it is elastic (Heartbeat.Elastic, a worker
// that takes role commands): the moved worker is routed to from the
// first heartbeat of its new role, as the role command promises, instead
// of after another admission round. For an observer whose admission only
// shows that a gRPC server answers at the address (plaintext gRPC),
// which a role change at the same address leaves as shown; one that
// verifies the role in a certificate admits again instead.
func AdmitRoleMoves() MembershipOption { return func(m *Membership) { m.moves = true } }

// DefaultMaxPending is the coordinator's bound on members not admitted
// yet: workers starting at once, far more than a rollout starts.
const DefaultMaxPending = 256

// MaxPending bounds the members that are not admitted yet (with
// RequireAdmission) to n (> 0): a heartbeat of a new id beyond it is
// refused (ErrPendingFull) until some are admitted or expire, so that
// heartbeats under forged ids, which a role's shared credential allows,
// cannot grow the membership without bound. Admitted members are never
// refused for it. PendingRefused counts the refusals.
func MaxPending(n int) MembershipOption { return func(m *Membership) { m.maxPending = n } }

// ErrPendingFull: a heartbeat of a new id while MaxPending members await
// admission; wrapped with ErrRefused.
var ErrPendingFull = errors.New("control: too many workers awaiting admission")

// WithCheck makes Observe refuse heartbeats for which check returns an
// error (limits that contradict the observer's configuration): a refused
// heartbeat removes its id from the membership. check must be safe for
// concurrent use and must not call the Membership.
func WithCheck(check func(hb Heartbeat) error) MembershipOption {
	return func(m *Membership) { m.check = check }
}

// NewMembership returns an empty Membership whose members expire ttl after
// their last observed heartbeat (ttl > 0; a few heartbeat intervals).
func NewMembership(ttl time.Duration, opts ...MembershipOption) *Membership {
	m := &Membership{ttl: ttl, members: make(map[string]member), refused: make(map[string]string)}
	for _, o := range opts {
		o(m)
	}
	return m
}

// TTL returns the expiry age.
func (m *Membership) TTL() time.Duration { return m.ttl }

// Observe records hb, observed at now (the observer's clock, not hb.Time,
// so that clock skew between machines does not matter). The latest
// observation of an id replaces the earlier one, role included; a member
// stays admitted while its role and address stay the same (its address,
// for an elastic member with AdmitRoleMoves). Heartbeats
// that fail Validate are ignored. A heartbeat the check (WithCheck)
// refuses removes its id; Observe returns ErrRefused, wrapped with the
// reason, for the first refusal of an id and for each new reason, nil
// for repeats (so the caller logs each once). hb's slices must not be
// modified after the call.
func (m *Membership) Observe(hb Heartbeat, now time.Time) error {
	if hb.Validate() != nil {
		return nil
	}
	var cerr error
	if m.check != nil {
		cerr = m.check(hb)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if cerr != nil {
		delete(m.members, hb.ID)
		if m.refused[hb.ID] == cerr.Error() {
			return nil
		}
		m.refused[hb.ID] = cerr.Error()
		return fmt.Errorf("%w: %s %s: %w", ErrRefused, hb.Role, hb.ID, cerr)
	}
	old, ok := m.members[hb.ID]
	if !ok && m.admit && m.maxPending > 0 && m.pendingLocked() >= m.maxPending {
		m.pendingRefused++
		const reason = "pending"
		if m.refused[hb.ID] == reason {
			return nil
		}
		m.refused[hb.ID] = reason
		return fmt.Errorf("%w: %s %s: %w (%d)", ErrRefused, hb.Role, hb.ID, ErrPendingFull, m.maxPending)
	}
	delete(m.refused, hb.ID)
	moved := m.moves && old.hb.Elastic && hb.Elastic
	admitted := ok && old.admitted && (old.hb.Role == hb.Role || moved) && old.hb.GRPCAddr == hb.GRPCAddr
	mb := member{hb: hb, seen: now, admitted: admitted}
	if ok && old.unreachable && old.hb.GRPCAddr == hb.GRPCAddr && now.Sub(old.unreachableAt) < UnreachableGrace {
		// Sent, most likely, before the call failed: it says nothing
		// of the worker since.
		mb.unreachable, mb.unreachableAt = true, old.unreachableAt
	}
	m.members[hb.ID] = mb
	return nil
}

// pendingLocked returns how many members are not admitted.
func (m *Membership) pendingLocked() int {
	n := 0
	for _, mb := range m.members {
		if !mb.admitted {
			n++
		}
	}
	return n
}

// PendingRefused returns how many heartbeats MaxPending refused.
func (m *Membership) PendingRefused() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pendingRefused
}

// Admit admits id, if it is a member of role at addr (see
// RequireAdmission), and reports whether it did.
func (m *Membership) Admit(id, role, addr string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb, ok := m.members[id]
	if !ok || mb.hb.Role != role || mb.hb.GRPCAddr != addr {
		return false
	}
	mb.admitted = true
	m.members[id] = mb
	return true
}

// Pending returns the live members not admitted yet, sorted by ID (none
// without RequireAdmission). Ownership as for Members.
func (m *Membership) Pending() []Heartbeat {
	if !m.admit {
		return nil
	}
	return m.list(func(mb member) bool { return !mb.admitted })
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
	if len(m.members) == 0 || len(m.refused) > 4*len(m.members)+1024 {
		clear(m.refused) // bounded: only log deduplication is lost
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

// Excuse credits every member with d (> 0) of silence the observer did
// not watch: its expiry came d late (its process starved of CPU, a GC
// pause, a suspended VM), and heartbeats sent meanwhile may still wait
// unread, their publishers as starved as it when they share its host.
// Each member's last observation moves d later, to now at most, so that
// a member expires after a TTL of silence the observer was there to
// hear, not at the first expiry after a pause.
func (m *Membership) Excuse(d time.Duration, now time.Time) {
	if d <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, mb := range m.members {
		if seen := mb.seen.Add(d); seen.Before(now) {
			mb.seen = seen
		} else if now.After(mb.seen) {
			mb.seen = now
		}
		m.members[id] = mb
	}
}

// Remove drops id at once (a worker that said goodbye). Unknown ids are
// not an error.
func (m *Membership) Remove(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.members, id)
}

// UnreachableGrace is how long after a failed call (Unreachable) a
// heartbeat is taken to have been on its way before the failure: one
// observed sooner does not bring the member back. Without it, a worker
// killed just after publishing a heartbeat came back at once and took
// the next request (a dead worker's last heartbeat arrives within
// milliseconds; under load, tens of them).
const UnreachableGrace = 250 * time.Millisecond

// Unreachable marks id, if it is a member at addr, as unreachable at now
// (observer clock): a call to it failed as if the worker were gone
// (connection refused or reset), so Members leaves it out until a
// heartbeat is observed UnreachableGrace or more after now. A dead
// worker thus stops taking requests at its first failed call rather than
// when its heartbeat expires; a live one is back within a heartbeat
// interval or two. It stays in All and Get, so that cleanup still finds
// it. A member since re-registered at another address is left alone.
func (m *Membership) Unreachable(id, addr string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mb, ok := m.members[id]; ok && mb.hb.GRPCAddr == addr {
		mb.unreachable, mb.unreachableAt = true, now // the latest failure counts
		m.members[id] = mb
	}
}

// Members returns the live members of role that are reachable, not
// draining and, with RequireAdmission, admitted, sorted by ID. The caller
// owns the returned slice; the heartbeats' own slices are shared and must
// not be modified.
func (m *Membership) Members(role Role) []Heartbeat {
	return m.list(func(mb member) bool {
		return mb.hb.Role == string(role) && !mb.hb.Draining && !mb.unreachable && (mb.admitted || !m.admit)
	})
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
	// MaxSeqLen is the largest positive MaxSeqLen the model's members
	// report (the longest request some worker can take; the router sends
	// each request only to workers whose own MaxSeqLen fits it), or 0 when
	// none reports one.
	MaxSeqLen int
	// ByRole is the largest positive MaxSeqLen of the model's members of
	// each role that reports one.
	ByRole map[Role]int
}

// Models returns the distinct non-empty model names of the live members
// (with RequireAdmission, admitted ones only), draining ones included,
// sorted by name, each with its largest reported MaxSeqLen, overall and
// by role. The caller owns the returned slice.
func (m *Membership) Models() []Model {
	var out []Model
	for _, hb := range m.list(func(mb member) bool { return mb.admitted || !m.admit }) {
		if hb.Model == "" {
			continue
		}
		i := slices.IndexFunc(out, func(x Model) bool { return x.Name == hb.Model })
		if i < 0 {
			out = append(out, Model{Name: hb.Model})
			i = len(out) - 1
		}
		if hb.MaxSeqLen > 0 {
			out[i].MaxSeqLen = max(out[i].MaxSeqLen, hb.MaxSeqLen)
			if out[i].ByRole == nil {
				out[i].ByRole = map[Role]int{}
			}
			r := Role(hb.Role)
			out[i].ByRole[r] = max(out[i].ByRole[r], hb.MaxSeqLen)
		}
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

// Admitted returns the role of id and true when id is a live member that
// counts: admitted, or any member without RequireAdmission (draining and
// unreachable ones included).
func (m *Membership) Admitted(id string) (role string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb, ok := m.members[id]
	if !ok || m.admit && !mb.admitted {
		return "", false
	}
	return mb.hb.Role, true
}
