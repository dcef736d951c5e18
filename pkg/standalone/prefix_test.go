package standalone_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/standalone"
)

// TestDefaultsReusePrefix: the README's serve command (--standalone, every
// other setting its default) reuses a shared prompt prefix: of three
// prompts sharing a 600-token prefix, the second and third report
// prefix_hit_tokens > 0 in their pdserve object.
func TestDefaultsReusePrefix(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone = addr, true
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	s, err := standalone.Start(context.Background(), o, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	poll.CheckFor(t, 10*time.Second, 10*time.Millisecond, s.Ready)
	// The tiny model's tokenizer is byte-level: 600 bytes, 600 tokens.
	prefix := strings.Repeat("abcdefghij", 60)
	for i := range 3 {
		body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": prefix + fmt.Sprintf(" question %d", i), "max_tokens": 2})
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			PDServe struct {
				PrefixHitTokens int `json:"prefix_hit_tokens"`
			} `json:"pdserve"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d, %v", i, resp.StatusCode, err)
		}
		hit := out.PDServe.PrefixHitTokens
		t.Logf("request %d: prefix_hit_tokens %d", i, hit)
		if i > 0 && hit < 512 {
			t.Errorf("request %d: prefix_hit_tokens %d, want most of the 600-token prefix (>= 512)", i, hit)
		}
	}
}
