package config

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestResponseCache(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       ResponseCache
		on         bool
		ttl        time.Duration
		bytes      int64
		invalid    bool
	}{
		{name: "absent: off", yaml: "", ttl: DefaultResponseCacheTTL, bytes: DefaultResponseCacheMaxBytes},
		{name: "entries only", yaml: "response_cache: {entries: 100}", want: ResponseCache{Entries: 100}, on: true,
			ttl: DefaultResponseCacheTTL, bytes: DefaultResponseCacheMaxBytes},
		{name: "all", yaml: "response_cache: {entries: 5, ttl: 90s, max_bytes: 1048576}",
			want: ResponseCache{Entries: 5, TTL: 90 * time.Second, MaxBytes: 1 << 20}, on: true, ttl: 90 * time.Second, bytes: 1 << 20},
		{name: "negative entries", yaml: "response_cache: {entries: -1}", invalid: true},
		{name: "negative ttl", yaml: "response_cache: {entries: 1, ttl: -1s}", invalid: true},
		{name: "negative bytes", yaml: "response_cache: {entries: 1, max_bytes: -5}", invalid: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.yaml))
			if tc.invalid {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Parse = %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rc := p.ResponseCache
			if diff := cmp.Diff(tc.want, rc); diff != "" {
				t.Errorf("response_cache (-want +got):\n%s", diff)
			}
			if rc.On() != tc.on || rc.TTLOrDefault() != tc.ttl || rc.MaxBytesOrDefault() != tc.bytes {
				t.Errorf("On %v TTL %v bytes %d; want %v %v %d", rc.On(), rc.TTLOrDefault(), rc.MaxBytesOrDefault(), tc.on, tc.ttl, tc.bytes)
			}
		})
	}
	if _, err := Parse([]byte("response_cache: {entries: 1, size: 3}")); err == nil {
		t.Error("an unknown response_cache field parsed")
	}
}
