package prefill

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/wire"
)

// overflowSchema is a schema within grammar.DefaultLimits whose grammar
// allows no first token: an anyOf of three objects of 1,500 optional
// properties each holds 4,500 parse stacks after "{", over the matcher's
// bound.
func overflowSchema() string {
	var b strings.Builder
	b.WriteString(`{"anyOf":[`)
	for o := range 3 {
		if o > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"object","properties":{`)
		for i := range 1500 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"o%dp%d":{"type":"null"}`, o, i)
		}
		b.WriteString(`}}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

// The first token is sampled under the request's grammar; when the
// grammar allows none, the request ends with FAILED_PRECONDITION marked
// as the grammar's (wire.IsGrammarRefused; not a KV-transfer failure), no first token is sent, and the KV is not
// committed to the decode worker (issue 39 §1). On the old code the
// refused token went out as the first token.
func TestGrammarAllowingNoFirstTokenFails(t *testing.T) {
	good, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"c":{"enum":["red","green"]}},"required":["c"]}`))
	if err != nil {
		t.Fatal(err)
	}
	none, err := grammar.FromSchema([]byte(overflowSchema()))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	for _, tc := range []struct {
		id, gbnf string
		ok       bool
	}{{"good", good, true}, {"none", none, false}} {
		stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: tc.id, PromptTokens: prompt(20, 1), DecodeAddr: addr,
			Sampling: &pdservev1.Sampling{Grammar: tc.gbnf, Temperature: 1, Seed: 3}})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := collect(stream)
		got, _ := f.get(tc.id)
		if tc.ok {
			if err != nil || ev.first.GetToken() != '{' || !got.committed {
				t.Errorf("%s: first %v, committed %v, %v; want '{' committed", tc.id, ev.first, got.committed, err)
			}
			continue
		}
		if status.Code(err) != codes.FailedPrecondition || wire.IsKVTransferFailed(err) || !wire.IsGrammarRefused(err) || !strings.Contains(err.Error(), "grammar allows no first token") {
			t.Errorf("%s: %v (transfer mark %v), want a FAILED_PRECONDITION marked as the grammar's, naming it", tc.id, err, wire.IsKVTransferFailed(err))
		}
		if ev.first != nil || got.committed {
			t.Errorf("%s: first token %v sent, kv committed %v; want neither", tc.id, ev.first, got.committed)
		}
	}
}
