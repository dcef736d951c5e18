package prefill

import (
	"errors"
	"testing"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// q80Engine is the tiny reference engine claiming q8_0 KV, as a llama.cpp
// engine with --cache-type q8_0 does. Only its spec matters here.
type q80Engine struct{ *ref.Engine }

func (e q80Engine) Spec() engine.ModelSpec {
	s := e.Engine.Spec()
	s.KVDType = engine.Q8_0
	return s
}

// TestCodecMustTakeKVDType checks that a codec that cannot code the
// engine's KV dtype is refused when the worker starts and per request.
func TestCodecMustTakeKVDType(t *testing.T) {
	eng := q80Engine{newEngine(t)}
	if err := eng.Spec().Validate(); err != nil {
		t.Fatalf("q8_0 spec of the tiny preset: %v", err)
	}
	d := kvtransfer.NewDialer()
	defer d.Close()
	for _, name := range []string{"bf16", "f16", "fp8", "int8"} {
		o := smallOptions()
		o.Codec = name
		if _, err := New(eng, d, o, zaptest.NewLogger(t), nil); !errors.Is(err, codec.ErrDType) {
			t.Errorf("New with codec %s on q8_0 kv = %v, want ErrDType", name, err)
		}
	}
	o := smallOptions()
	o.Codec = "zstd"
	w := newWorkerOn(t, eng, o, true)
	ctx := testCtx(t)
	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: []int32{1}, DecodeAddr: "a:1", Codec: "int8"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("request with codec int8 on q8_0 kv: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "x", DecodeAddr: "a:1", Codec: "bf16"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("resend with codec bf16 on q8_0 kv: %v, want INVALID_ARGUMENT", err)
	}
}
