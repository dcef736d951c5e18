package adversarial

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// The KV payload layout (package control's kvevents.go), written by hand
// as a hostile worker would.
const (
	kvEvents   = 1
	kvSnapshot = 2
)

func kvHeader(kind byte, epoch, seq uint64) []byte {
	b := []byte{1, kind}
	b = binary.LittleEndian.AppendUint64(b, epoch)
	return binary.LittleEndian.AppendUint64(b, seq)
}

// snapshotPart encodes part of parts of a snapshot holding hs.
func snapshotPart(epoch, seq uint64, part, parts uint32, hs ...uint64) []byte {
	b := kvHeader(kvSnapshot, epoch, seq)
	b = binary.LittleEndian.AppendUint32(b, part)
	b = binary.LittleEndian.AppendUint32(b, parts)
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// events encodes an events batch storing hs.
func events(epoch, seq uint64, hs ...uint64) []byte {
	b := kvHeader(kvEvents, epoch, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(hs)))
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// attacked is a deployment with the shared worker credentials of the
// README's multi-process recipe (one NATS user per role, any id), which
// the tests log in with as a hostile worker would.
type attacked struct {
	*deployment
	decode, prefill *workerrun.Worker
	creds           map[control.Role]control.NATSUser
}

func startAttacked(t *testing.T, edit func(*coordinator.Options)) *attacked {
	t.Helper()
	a := &attacked{creds: map[control.Role]control.NATSUser{}}
	for _, r := range []control.Role{control.RoleDecode, control.RolePrefill} {
		a.creds[r] = control.NewNATSUser(r, "")
	}
	a.deployment = start(t, nil, func(o *coordinator.Options) {
		o.NATSUsers = append(o.NATSUsers, a.creds[control.RoleDecode], a.creds[control.RolePrefill])
		if edit != nil {
			edit(o)
		}
	})
	for _, w := range a.Workers() {
		switch w.Role() {
		case control.RoleDecode:
			a.decode = w
		case control.RolePrefill:
			a.prefill = w
		}
	}
	// The workers' own KV views, founded at admission, before the
	// attack: nothing of theirs is in flight after this.
	poll.WaitFor(t, "the workers' KV views", func() bool {
		ix := a.KVIndex()
		return ix.Blocks(a.decode.ID()) != nil && ix.Blocks(a.prefill.ID()) != nil
	})
	return a
}

// connect logs in with role's shared credential.
func (a *attacked) connect(t *testing.T, role control.Role) *nats.Conn {
	t.Helper()
	u := a.creds[role]
	nc, err := nats.Connect(a.NATSURL(), nats.UserInfo(u.User, u.Password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publish publishes data on subject and flushes.
func publish(t *testing.T, nc *nats.Conn, subject string, data []byte) {
	t.Helper()
	if err := nc.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
}

// marker publishes, on the admitted worker id's subject, a snapshot of
// one hash under a fresh epoch and waits until the coordinator's index
// holds it: every payload published before it on nc was handled.
func (a *attacked) marker(t *testing.T, nc *nats.Conn, role control.Role, id string, h uint64) {
	t.Helper()
	publish(t, nc, control.KVSubject(string(role), id), snapshotPart(h, 0, 0, 1, h))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "the marker snapshot", func() bool {
		w := a.KVIndex().Blocks(id)
		return w != nil && w.Has(h)
	})
}

// TestKVSnapshotBomb: a 34-byte snapshot part announcing 2^24 parts,
// sent under an admitted worker's id with the role's credential, is
// refused and counted; the coordinator's heap does not move. The unfixed
// index sized a map of parts × hashes from it: +600 MB RSS for this one,
// out of memory at 2^27.
func TestKVSnapshotBomb(t *testing.T) {
	a := startAttacked(t, nil)
	nc := a.connect(t, control.RoleDecode)
	bomb := snapshotPart(0xb0b, 0, 0, 1<<24, 42)
	if len(bomb) != 34 {
		t.Fatalf("bomb of %d bytes", len(bomb))
	}
	peak := heapPeak(func() {
		publish(t, nc, control.KVSubject(string(control.RoleDecode), a.decode.ID()), bomb)
		a.marker(t, nc, control.RoleDecode, a.decode.ID(), 0x5eed)
	})
	t.Logf("heap peak over the base: %d bytes", peak)
	if peak > 32<<20 {
		t.Errorf("heap peak %d bytes over the base, want under 32 MiB", peak)
	}
	if n := counter(t, a.Registry(), "pdserve_coordinator_kv_events_dropped_total"); n < 1 {
		t.Errorf("no refusal counted (%v)", n)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("not ready after the bomb: %v", err)
	}
}

// TestForgedWorkerIDs: with a role's shared credential, heartbeats
// under 1500 forged ids, each with a KV snapshot of 512 blocks, neither
// grow the membership beyond the ids awaiting admission
// (control.DefaultMaxPending, the rest refused and counted) nor put a
// block in the KV index. The unfixed coordinator kept every id as a
// member and indexed every block (+660 MB for two ids at 4 Mi blocks
// each).
func TestForgedWorkerIDs(t *testing.T) {
	// No forged id expires during the test: each is kept or refused.
	a := startAttacked(t, func(o *coordinator.Options) { o.HeartbeatTTL = 10 * time.Minute })
	nc := a.connect(t, control.RoleDecode)
	real, ok := a.Membership().Get(a.decode.ID())
	if !ok {
		t.Fatal("no decode member")
	}
	const forged = 1500
	hs := make([]uint64, 512)
	for i := range forged {
		id := fmt.Sprint("forged-", i)
		hb := control.Heartbeat{ID: id, Role: string(control.RoleDecode), GRPCAddr: "127.0.0.1:1", Model: real.Model, MaxSeqLen: real.MaxSeqLen,
			KVBlocksFree: 8, KVBlocksTotal: 8, BlockTokens: real.BlockTokens, HashKeyID: real.HashKeyID, Time: time.Now()}
		data, err := json.Marshal(hb)
		if err != nil {
			t.Fatal(err)
		}
		publish(t, nc, control.HeartbeatSubject(hb.Role, id), data)
		for j := range hs {
			hs[j] = uint64(i)<<32 | uint64(j)
		}
		publish(t, nc, control.KVSubject(hb.Role, id), snapshotPart(uint64(i+1), 0, 0, 1, hs...))
	}
	a.marker(t, nc, control.RoleDecode, a.decode.ID(), 0x5eed)
	refused := func() float64 {
		return counter(t, a.Registry(), "pdserve_coordinator_heartbeats_pending_refused_total")
	}
	poll.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if n := len(a.Membership().All()) - 2 + int(refused()); n < forged {
			return fmt.Errorf("%d of %d forged heartbeats handled", n, forged)
		}
		return nil
	})
	if n := len(a.Membership().All()); n > control.DefaultMaxPending+2 {
		t.Errorf("%d members after %d forged ids, want at most %d", n, forged, control.DefaultMaxPending+2)
	}
	ix := a.KVIndex()
	if n := ix.Len(); n != 2 {
		t.Errorf("the KV index holds %d workers' views, want the 2 admitted", n)
	}
	for _, id := range []string{"forged-0", fmt.Sprint("forged-", forged-1)} {
		if ix.Blocks(id) != nil {
			t.Errorf("%s is indexed", id)
		}
	}
}

// TestKVFlood: a worker that floods its KV subject (100 snapshots of
// 64 Ki blocks, 50 MiB, under the decode worker's id) does not make the
// coordinator drop another admitted worker's events: 100 events batches
// sent amid the flood all arrive in order, no gap. Payloads are queued
// per worker (pdserve_coordinator_kv_events_dropped_total{reason=
// "queue_full"} counts the flooder's own losses). The unfixed
// coordinator applied every worker's payloads on one subscription,
// whose pending limit (64 MiB) a larger flood overran: "slow consumer,
// messages dropped", honest workers' among them; pkg/control's
// TestKVFloodIsolation shows it without the volume.
func TestKVFlood(t *testing.T) {
	a := startAttacked(t, nil)
	flood := a.connect(t, control.RoleDecode)
	honest := a.connect(t, control.RoleDecode)
	victim := a.fakeWorker(t, honest, "victim")
	victimSubj := control.KVSubject(string(control.RoleDecode), victim)
	decodeSubj := control.KVSubject(string(control.RoleDecode), a.decode.ID())
	const epoch, batches = 0x600d, 100
	publish(t, honest, victimSubj, snapshotPart(epoch, 0, 0, 1))
	big := make([]uint64, 1<<16)
	for i := range batches {
		for j := range big {
			big[j] = uint64(i)<<32 | uint64(j)
		}
		publish(t, flood, decodeSubj, snapshotPart(uint64(1000+i), 0, 0, 1, big...))
		n := uint64(i + 1)
		publish(t, honest, victimSubj, events(epoch, n, 0xabc000+n))
	}
	if err := honest.Flush(); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		w := a.KVIndex().Blocks(victim)
		if w == nil {
			return errors.New("no view of the victim")
		}
		if st := w.State(); st.Seq != batches || st.Gaps != 0 || st.Blocks != batches {
			return fmt.Errorf("the victim's view %+v, want seq %d, no gap, %d blocks", st, batches, batches)
		}
		return nil
	})
	t.Logf("KV payloads dropped (the flooder's, for its full queue): %v", counter(t, a.Registry(), "pdserve_coordinator_kv_events_dropped_total"))
}

// fakeWorker makes id an admitted decode worker: a gRPC health server
// that answers SERVING (enough for admission over plaintext) and its
// heartbeats on nc until the test ends. It returns id once admitted.
func (a *attacked) fakeWorker(t *testing.T, nc *nats.Conn, id string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The coordinator's keepalive pings are welcome.
	srv := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Millisecond, PermitWithoutStream: true}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	real, _ := a.Membership().Get(a.decode.ID())
	hb := control.Heartbeat{ID: id, Role: string(control.RoleDecode), GRPCAddr: lis.Addr().String(), Model: real.Model, MaxSeqLen: real.MaxSeqLen,
		KVBlocksFree: 0, KVBlocksTotal: 8, BlockTokens: real.BlockTokens, HashKeyID: real.HashKeyID}
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped })
	go func() {
		defer close(stopped)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			hb.Time = time.Now()
			if data, err := json.Marshal(hb); err == nil {
				_ = nc.Publish(control.HeartbeatSubject(hb.Role, id), data)
			}
			select {
			case <-done:
				return
			case <-tk.C:
			}
		}
	}()
	poll.WaitFor(t, "the fake worker's admission", func() bool {
		_, ok := a.Membership().Admitted(id)
		return ok
	})
	return id
}

// TestDialOutsideWorkerNetworks: a heartbeat naming an address outside
// --worker-networks is refused (counted, reason network) and the
// address is never dialed, while one inside is (the admission probe);
// the unfixed coordinator probed any address a heartbeat named every
// second.
func TestDialOutsideWorkerNetworks(t *testing.T) {
	a := startAttacked(t, func(o *coordinator.Options) { o.WorkerNetworks = "127.0.0.1/32" })
	nc := a.connect(t, control.RoleDecode)
	listen := func(ip string) (string, chan struct{}) {
		lis, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		dialed := make(chan struct{}, 16)
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				dialed <- struct{}{}
				c.Close()
			}
		}()
		return lis.Addr().String(), dialed
	}
	outside, outDialed := listen("127.0.0.2")
	inside, inDialed := listen("127.0.0.1")
	real, _ := a.Membership().Get(a.decode.ID())
	send := func(id, addr string) {
		hb := control.Heartbeat{ID: id, Role: string(control.RoleDecode), GRPCAddr: addr, Model: real.Model, MaxSeqLen: real.MaxSeqLen,
			KVBlocksFree: 8, KVBlocksTotal: 8, BlockTokens: real.BlockTokens, HashKeyID: real.HashKeyID, Time: time.Now()}
		data, err := json.Marshal(hb)
		if err != nil {
			t.Fatal(err)
		}
		publish(t, nc, control.HeartbeatSubject(hb.Role, id), data)
	}
	send("ssrf", outside)
	send("probe-inside", inside)
	select {
	case <-inDialed: // the admission probe: the coordinator dials what it may
	case <-time.After(20 * time.Second):
		t.Fatal("the address inside the networks was never dialed")
	}
	poll.WaitFor(t, "the refusal", func() bool {
		return counter(t, a.Registry(), "pdserve_coordinator_heartbeats_refused_total") >= 1
	})
	if _, ok := a.Membership().Get("ssrf"); ok {
		t.Error("the heartbeat naming an address outside the networks made a member")
	}
	select {
	case <-outDialed:
		t.Error("the coordinator dialed an address outside --worker-networks")
	default:
	}
}
