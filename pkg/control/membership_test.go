package control

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestMembership(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	ttl := 3 * time.Second
	hb := func(id string, role Role, draining bool) Heartbeat {
		return Heartbeat{ID: id, Role: string(role), GRPCAddr: id + ":1", Draining: draining}
	}
	type obs struct {
		hb Heartbeat
		at time.Duration // after t0
	}
	tests := []struct {
		name     string
		observe  []obs
		expireAt time.Duration
		role     Role
		wantGone []string
		want     []Heartbeat // Members(role) after Expire
	}{
		{
			name:    "sorted by id, role filtered",
			observe: []obs{{hb("d2", RoleDecode, false), 0}, {hb("p1", RolePrefill, false), 0}, {hb("d1", RoleDecode, false), 0}, {hb("c1", RoleColocated, false), 0}},
			role:    RoleDecode,
			want:    []Heartbeat{hb("d1", RoleDecode, false), hb("d2", RoleDecode, false)},
		},
		{
			name:    "draining excluded",
			observe: []obs{{hb("d1", RoleDecode, true), 0}, {hb("d2", RoleDecode, false), 0}},
			role:    RoleDecode,
			want:    []Heartbeat{hb("d2", RoleDecode, false)},
		},
		{
			name:     "expired after ttl, not at ttl",
			observe:  []obs{{hb("d1", RoleDecode, false), 0}, {hb("d2", RoleDecode, false), time.Nanosecond}, {hb("d3", RoleDecode, false), -time.Nanosecond}},
			expireAt: ttl,
			role:     RoleDecode,
			wantGone: []string{"d3"},
			want:     []Heartbeat{hb("d1", RoleDecode, false), hb("d2", RoleDecode, false)},
		},
		{
			name:     "a later heartbeat renews",
			observe:  []obs{{hb("d1", RoleDecode, false), 0}, {hb("d1", RoleDecode, false), 2 * time.Second}, {hb("d2", RoleDecode, false), 0}},
			expireAt: 4 * time.Second,
			role:     RoleDecode,
			wantGone: []string{"d2"},
			want:     []Heartbeat{hb("d1", RoleDecode, false)},
		},
		{
			name:    "the latest heartbeat wins, role included",
			observe: []obs{{hb("w", RoleDecode, false), 0}, {hb("w", RolePrefill, false), time.Second}},
			role:    RolePrefill,
			want:    []Heartbeat{hb("w", RolePrefill, false)},
		},
		{
			name:    "invalid ids ignored",
			observe: []obs{{hb("", RoleDecode, false), 0}, {hb("a.b", RoleDecode, false), 0}, {hb("x", "de code", false), 0}},
			role:    RoleDecode,
			want:    []Heartbeat{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMembership(ttl)
			for _, o := range tc.observe {
				m.Observe(o.hb, t0.Add(o.at))
			}
			gone := m.Expire(t0.Add(tc.expireAt))
			if diff := cmp.Diff(tc.wantGone, gone); diff != "" {
				t.Errorf("Expire (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, m.Members(tc.role)); diff != "" {
				t.Errorf("Members(%s) (-want +got):\n%s", tc.role, diff)
			}
			for _, id := range gone {
				if _, ok := m.Get(id); ok {
					t.Errorf("Get(%s) after expiry: still a member", id)
				}
			}
		})
	}
}

func TestMembershipGetAllRemove(t *testing.T) {
	t0 := time.Unix(100, 0)
	m := NewMembership(time.Second)
	d := Heartbeat{ID: "d1", Role: string(RoleDecode), Draining: true, KVBlocksFree: 7}
	p := Heartbeat{ID: "p1", Role: string(RolePrefill)}
	m.Observe(p, t0)
	m.Observe(d, t0)
	if got, ok := m.Get("d1"); !ok || !cmp.Equal(got, d) {
		t.Errorf("Get(d1) = %+v, %v; want the draining member", got, ok)
	}
	if diff := cmp.Diff([]Heartbeat{d, p}, m.All()); diff != "" {
		t.Errorf("All (-want +got):\n%s", diff)
	}
	m.Remove("d1")
	m.Remove("unknown")
	if _, ok := m.Get("d1"); ok {
		t.Error("Get(d1) after Remove: still a member")
	}
}

// TestMembershipUnreachable: a member marked unreachable leaves Members
// (not All or Get) until its next heartbeat, but for one observed within
// UnreachableGrace of the failure (sent before it, most likely); a mark
// for another address (the id re-registered elsewhere) or an unknown id
// changes nothing.
func TestMembershipUnreachable(t *testing.T) {
	t0 := time.Unix(100, 0)
	m := NewMembership(time.Minute)
	p1 := Heartbeat{ID: "p1", Role: string(RolePrefill), GRPCAddr: "a:1"}
	p2 := Heartbeat{ID: "p2", Role: string(RolePrefill), GRPCAddr: "b:1"}
	m.Observe(p1, t0)
	m.Observe(p2, t0)
	m.Unreachable("p1", "a:1", t0)
	m.Unreachable("p2", "elsewhere:1", t0)
	m.Unreachable("unknown", "a:1", t0)
	if diff := cmp.Diff([]Heartbeat{p2}, m.Members(RolePrefill)); diff != "" {
		t.Errorf("Members after Unreachable(p1) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Heartbeat{p1, p2}, m.All()); diff != "" {
		t.Errorf("All after Unreachable(p1) (-want +got):\n%s", diff)
	}
	if _, ok := m.Get("p1"); !ok {
		t.Error("Get(p1) after Unreachable: not a member")
	}
	m.Observe(p1, t0.Add(UnreachableGrace/5))
	if diff := cmp.Diff([]Heartbeat{p2}, m.Members(RolePrefill)); diff != "" {
		t.Errorf("Members after a heartbeat within the grace (-want +got):\n%s", diff)
	}
	m.Observe(p1, t0.Add(time.Second))
	if diff := cmp.Diff([]Heartbeat{p1, p2}, m.Members(RolePrefill)); diff != "" {
		t.Errorf("Members after p1's next heartbeat (-want +got):\n%s", diff)
	}
}

func TestValidToken(t *testing.T) {
	for _, s := range []string{"", "a.b", "a*", "a>", "a b", "a\tb"} {
		if err := ValidToken(s); err == nil {
			t.Errorf("ValidToken(%q) = nil, want an error", s)
		}
	}
	for _, s := range []string{"decode-0", "p_1", "W9"} {
		if err := ValidToken(s); err != nil {
			t.Errorf("ValidToken(%q) = %v", s, err)
		}
	}
}

func TestModels(t *testing.T) {
	m := NewMembership(time.Minute)
	now := time.Unix(100, 0)
	for _, hb := range []Heartbeat{
		{ID: "d1", Role: string(RoleDecode), Model: "llama", MaxSeqLen: 8192},
		{ID: "p1", Role: string(RolePrefill), Model: "llama", MaxSeqLen: 4096}, // the largest wins
		{ID: "d2", Role: string(RoleDecode), Model: "llama"},                   // unknown: ignored
		{ID: "d3", Role: string(RoleDecode), Model: "tiny", MaxSeqLen: 1024, Draining: true},
		{ID: "d4", Role: string(RoleDecode), Model: "old"},
		{ID: "d5", Role: string(RoleDecode), MaxSeqLen: 10}, // no model name
	} {
		m.Observe(hb, now)
	}
	want := []Model{{Name: "llama", MaxSeqLen: 8192, ByRole: map[Role]int{RoleDecode: 8192, RolePrefill: 4096}}, {Name: "old"},
		{Name: "tiny", MaxSeqLen: 1024, ByRole: map[Role]int{RoleDecode: 1024}}}
	if diff := cmp.Diff(want, m.Models()); diff != "" {
		t.Errorf("Models (-want +got):\n%s", diff)
	}
	m.Expire(now.Add(2 * time.Minute))
	if got := m.Models(); len(got) != 0 {
		t.Errorf("Models after expiry = %v, want none", got)
	}
}

func TestMinSeqLen(t *testing.T) {
	for _, tc := range []struct{ a, b, want int }{
		{0, 0, 0}, {0, 5, 5}, {5, 0, 5}, {3, 5, 3}, {5, 3, 3}, {-1, 4, 4}, {-1, -1, 0},
	} {
		if got := MinSeqLen(tc.a, tc.b); got != tc.want {
			t.Errorf("MinSeqLen(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// With RequireAdmission a member is routable, and its model listed, only
// once admitted for its role and address; a new address or role needs
// admitting again.
func TestAdmission(t *testing.T) {
	m := NewMembership(time.Minute, RequireAdmission())
	now := time.Unix(100, 0)
	d := Heartbeat{ID: "d1", Role: string(RoleDecode), GRPCAddr: "10.0.0.1:9000", Model: "llama", MaxSeqLen: 4096}
	m.Observe(d, now)
	if got := m.Members(RoleDecode); len(got) != 0 {
		t.Fatalf("Members before admission = %v, want none", got)
	}
	if got := m.Models(); len(got) != 0 {
		t.Fatalf("Models before admission = %v, want none", got)
	}
	if got := m.Pending(); len(got) != 1 || got[0].ID != "d1" {
		t.Fatalf("Pending = %v, want d1", got)
	}
	for _, bad := range [][2]string{{string(RolePrefill), d.GRPCAddr}, {d.Role, "10.0.0.2:9000"}} {
		if m.Admit("d1", bad[0], bad[1]) {
			t.Errorf("Admit(d1, %s, %s) admitted a member of another role or address", bad[0], bad[1])
		}
	}
	if !m.Admit("d1", d.Role, d.GRPCAddr) {
		t.Fatal("Admit refused the member's own role and address")
	}
	m.Observe(d, now.Add(time.Second)) // the next heartbeat keeps it admitted
	if got := m.Members(RoleDecode); len(got) != 1 {
		t.Fatalf("Members after admission = %v, want d1", got)
	}
	if diff := cmp.Diff([]Model{{Name: "llama", MaxSeqLen: 4096, ByRole: map[Role]int{RoleDecode: 4096}}}, m.Models()); diff != "" {
		t.Errorf("Models (-want +got):\n%s", diff)
	}
	moved := d
	moved.GRPCAddr = "10.0.0.66:9000"
	m.Observe(moved, now.Add(2*time.Second))
	if got := m.Members(RoleDecode); len(got) != 0 {
		t.Errorf("Members after the address changed = %v, want none until admitted again", got)
	}
}

// TestAdmitRoleMoves: with AdmitRoleMoves an admitted elastic member
// whose first heartbeat of a new role comes from the same address is a
// member of that role at once; a member not elastic (before or after),
// one whose address changed too, and any without the option wait for
// Admit again. It fails when Observe drops admission on every role
// change (the moved worker then waits a probe round after its first
// heartbeat), or keeps it for a member that is not elastic.
func TestAdmitRoleMoves(t *testing.T) {
	const addr = "10.0.0.1:9000"
	for _, tc := range []struct {
		name          string
		opt           bool
		before, after bool // Elastic
		addr          string
		want          bool
	}{
		{"elastic, same address", true, true, true, addr, true},
		{"elastic, another address", true, true, true, "10.0.0.2:9000", false},
		{"not elastic before", true, false, true, addr, false},
		{"not elastic after", true, true, false, addr, false},
		{"without the option", false, true, true, addr, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []MembershipOption{RequireAdmission()}
			if tc.opt {
				opts = append(opts, AdmitRoleMoves())
			}
			m := NewMembership(time.Minute, opts...)
			now := time.Unix(100, 0)
			d := Heartbeat{ID: "e1", Role: string(RoleDecode), GRPCAddr: addr, Model: "llama", Elastic: tc.before}
			m.Observe(d, now)
			if !m.Admit("e1", d.Role, addr) {
				t.Fatal("Admit refused the member's own role and address")
			}
			p := Heartbeat{ID: "e1", Role: string(RolePrefill), GRPCAddr: tc.addr, Model: "llama", Elastic: tc.after}
			m.Observe(p, now.Add(time.Second))
			got := slices.ContainsFunc(m.Members(RolePrefill), func(hb Heartbeat) bool { return hb.ID == "e1" })
			if got != tc.want {
				t.Errorf("a prefill member at its first prefill heartbeat: %v, want %v", got, tc.want)
			}
			if len(m.Members(RoleDecode)) != 0 {
				t.Error("still a decode member after its prefill heartbeat")
			}
			if pending := len(m.Pending()) == 1; pending == tc.want {
				t.Errorf("pending admission: %v, want %v", pending, !tc.want)
			}
		})
	}
}

// A heartbeat the check refuses removes its id; the refusal is reported
// once per reason.
func TestCheckRefuses(t *testing.T) {
	m := NewMembership(time.Minute, WithCheck(func(hb Heartbeat) error {
		if hb.MaxSeqLen == 1 {
			return errors.New("max_seq_len 1")
		}
		return nil
	}))
	now := time.Unix(100, 0)
	good := Heartbeat{ID: "d1", Role: string(RoleDecode), MaxSeqLen: 4096}
	if err := m.Observe(good, now); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.MaxSeqLen = 1
	if err := m.Observe(bad, now); !errors.Is(err, ErrRefused) {
		t.Fatalf("Observe(max_seq_len 1) = %v, want ErrRefused", err)
	}
	if err := m.Observe(bad, now); err != nil {
		t.Errorf("second refusal for the same reason = %v, want nil (logged once)", err)
	}
	if _, ok := m.Get("d1"); ok {
		t.Error("a refused heartbeat left its id a member")
	}
	if err := m.Observe(good, now); err != nil {
		t.Fatal(err)
	}
	if got := m.Members(RoleDecode); len(got) != 1 {
		t.Errorf("Members after a good heartbeat = %v, want d1", got)
	}
}
