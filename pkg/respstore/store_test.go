package respstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// startJS runs a JetStream nats-server in process and returns a
// connection to it.
func startJS(t *testing.T) (*server.Server, *nats.Conn) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return ns, nc
}

func testLimits() Limits {
	return Limits{TTL: time.Hour, MaxBytes: 1 << 20, MaxValueBytes: 4096, MaxPerOwner: 3, MaxBytesPerOwner: 8192, Replicas: 1, Memory: true}
}

func rec(id string, size int) Record {
	return Record{ID: id, CreatedAt: 1, Response: json.RawMessage(fmt.Sprintf(`{"id":%q,"pad":%q}`, id, strings.Repeat("x", size))),
		Input: json.RawMessage(`[]`), Conversation: json.RawMessage(`[]`)}
}

// TestOwnerOnly: a response is read and deleted only by its owner; it
// fails when key() ignores the owner.
func TestOwnerOnly(t *testing.T) {
	_, nc := startJS(t)
	ctx := context.Background()
	s, err := Open(ctx, nc, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "alice", rec("resp_1", 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "mallory", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's Get: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "mallory", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's Delete: %v, want ErrNotFound", err)
	}
	got, err := s.Get(ctx, "alice", "resp_1")
	if err != nil || got.ID != "resp_1" {
		t.Fatalf("owner's Get: %+v, %v", got, err)
	}
	if _, err := s.Get(ctx, "alice", "index"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the index is no response: %v", err)
	}
	if err := s.Delete(ctx, "alice", "resp_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "alice", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after Delete: %v, want ErrNotFound", err)
	}
}

// TestBounds: an owner keeps at most MaxPerOwner responses and
// MaxBytesPerOwner bytes, the oldest evicted first; a record over
// MaxValueBytes is refused; another owner is untouched. It fails
// without the eviction in updateIndex.
func TestBounds(t *testing.T) {
	_, nc := startJS(t)
	ctx := context.Background()
	s, err := Open(ctx, nc, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Unix(1000, 0)
	s.now = func() time.Time { tick = tick.Add(time.Second); return tick }
	if err := s.Put(ctx, "bob", rec("resp_b", 10)); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := s.Put(ctx, "alice", rec(fmt.Sprintf("resp_%d", i), 10)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		_, err := s.Get(ctx, "alice", fmt.Sprintf("resp_%d", i))
		if want := i >= 2; (err == nil) != want {
			t.Errorf("resp_%d kept = %v, want %v (count bound 3)", i, err == nil, want)
		}
	}
	// Bytes: two records of ~3 KiB fit 8 KiB with one small; a third
	// evicts the oldest.
	for i := range 3 {
		if err := s.Put(ctx, "alice", rec(fmt.Sprintf("big_%d", i), 3000)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Get(ctx, "alice", "big_0"); !errors.Is(err, ErrNotFound) {
		t.Errorf("big_0 should be evicted by the byte bound: %v", err)
	}
	for _, id := range []string{"big_1", "big_2"} {
		if _, err := s.Get(ctx, "alice", id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	if err := s.Put(ctx, "alice", rec("huge", 5000)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a record over MaxValueBytes: %v, want ErrTooLarge", err)
	}
	if _, err := s.Get(ctx, "bob", "resp_b"); err != nil {
		t.Errorf("another owner's response was evicted: %v", err)
	}
}

// TestLostStore: a response NATS no longer has is ErrNotFound, never
// an error that could be taken for another's.
func TestLostStore(t *testing.T) {
	_, nc := startJS(t)
	ctx := context.Background()
	s, err := Open(ctx, nc, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "alice", rec("resp_1", 10)); err != nil {
		t.Fatal(err)
	}
	// A new bucket, as after a NATS server that lost its store.
	js, _ := nc.JetStream()
	if err := js.DeleteKeyValue(Bucket); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, nc, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Get(ctx, "alice", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lost response: %v, want ErrNotFound", err)
	}
}
