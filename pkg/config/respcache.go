package config

import (
	"fmt"
	"time"
)

// Defaults of a response cache that is on but does not say.
const (
	DefaultResponseCacheTTL      = 10 * time.Minute
	DefaultResponseCacheMaxBytes = 256 << 20
)

// ResponseCache is the frontend's cache of completed responses for
// identical requests (package respcache): greedy (temperature 0) or
// seeded requests whose model, prompt tokens and sampling parameters
// match a completed one are replayed without contact with the model.
// Off unless Entries > 0 (the coordinator's --response-cache-entries sets
// it).
type ResponseCache struct {
	// Entries is the most responses held, each one prompt's choices
	// (≥ 0; 0: the cache is off).
	Entries int `yaml:"entries"`
	// TTL is how long a response is served after it was stored (≥ 0, a
	// duration such as "10m"; 0: DefaultResponseCacheTTL).
	TTL time.Duration `yaml:"ttl"`
	// MaxBytes bounds the memory the responses hold, as estimated from
	// their tokens and logprobs (≥ 0; 0: DefaultResponseCacheMaxBytes).
	MaxBytes int64 `yaml:"max_bytes"`
	// ShareAcrossKeys lets a request of one API key be answered from the
	// response of another key's identical request. Off by default: each
	// key has a partition of its own, since a hit (and its speed) tells
	// the asker that another tenant asked the same. Without API keys
	// every request is of the one anonymous partition.
	ShareAcrossKeys bool `yaml:"share_across_keys"`
}

// On reports whether the cache is on.
func (r ResponseCache) On() bool { return r.Entries > 0 }

// TTLOrDefault returns TTL, or DefaultResponseCacheTTL when it is 0.
func (r ResponseCache) TTLOrDefault() time.Duration {
	if r.TTL == 0 {
		return DefaultResponseCacheTTL
	}
	return r.TTL
}

// MaxBytesOrDefault returns MaxBytes, or DefaultResponseCacheMaxBytes
// when it is 0.
func (r ResponseCache) MaxBytesOrDefault() int64 {
	if r.MaxBytes == 0 {
		return DefaultResponseCacheMaxBytes
	}
	return r.MaxBytes
}

// validate reports the first problem, wrapping ErrInvalid.
func (r ResponseCache) validate() error {
	if r.Entries < 0 || r.TTL < 0 || r.MaxBytes < 0 {
		return fmt.Errorf("%w: response_cache: entries (0: off), ttl (0: %v) and max_bytes (0: %d) must be ≥ 0, got %d, %v, %d",
			ErrInvalid, DefaultResponseCacheTTL, DefaultResponseCacheMaxBytes, r.Entries, r.TTL, r.MaxBytes)
	}
	return nil
}
