package kvtransfer

import (
	"context"
	"errors"
	"testing"
)

// TestStartToken sends only [Start, Tokens) of every layer, as to a
// receiver holding a cached prefix: frames must begin at Start, the ack
// counts only what was sent, and a header whose Start is not below Tokens
// is refused.
func TestStartToken(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	addr := startServer(t, r, nil)
	d := NewDialer()
	defer d.Close()

	for _, start := range []int{-1, testShape.Tokens, testShape.Tokens + 1} {
		h := testShape
		h.Codec, h.Start = "none", start
		if _, err := d.Open(context.Background(), addr, h); !errors.Is(err, ErrBadHeader) {
			t.Errorf("Open with start %d = %v, want ErrBadHeader", start, err)
		}
	}

	const start = 16
	h := testShape
	h.Codec, h.Start = "none", start
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	kv := testKV(h)
	tb := h.TokenBytes
	if err := s.Send(0, 0, start, kv[0][:start*tb], 0); !errors.Is(err, ErrBadChunk) {
		t.Fatalf("Send before Start = %v, want ErrBadChunk", err)
	}
	for l := range kv {
		if err := s.Send(l, start, h.Tokens, kv[l][start*tb:], 0); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := s.Commit(context.Background(), Commit{FirstToken: 3})
	if err != nil {
		t.Fatal(err)
	}
	layers, commits, _, violation := r.onlySink(t).state()
	if violation != nil || len(commits) != 1 {
		t.Fatalf("sink: violation %v, commits %d", violation, len(commits))
	}
	if got := r.allSinks()[0].h.Start; got != start {
		t.Errorf("receiver saw start %d, want %d", got, start)
	}
	for l := range layers {
		if string(layers[l]) != string(kv[l][start*tb:]) {
			t.Errorf("layer %d differs", l)
		}
	}
	if want := int64(h.Layers * (h.Tokens - start) * tb); ack.BytesRaw != want {
		t.Errorf("ack bytes raw %d, want %d (only the suffix)", ack.BytesRaw, want)
	}
}
