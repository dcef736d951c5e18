package frontend

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math"
	"slices"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/respcache"
	"github.com/pdserve/pdserve/pkg/sampling"
)

// The response cache (Policy.ResponseCache; see "Response cache" in the
// package doc) works per prompt, around its Backend.Complete: a miss
// records what the Backend emitted and the finish reasons it returned,
// and a hit replays them through the same EmitFunc, so that the text,
// stop strings, logprobs, echo, stream chunks and whole responses are
// built by the same code from the same Outputs.

// cachedPrompt is one prompt's completed output: every Output the client
// took, in order, and the finish reasons Complete returned. Immutable
// once stored; replays share it.
type cachedPrompt struct {
	outputs  []Output
	finishes []string
}

// size estimates the bytes p holds.
func (p *cachedPrompt) size() int64 {
	n := int64(64 + 16*len(p.finishes))
	for _, o := range p.outputs {
		n += 64 + 4*int64(len(o.Tokens))
		for _, lp := range o.Logprobs {
			n += 32 + 8*int64(len(lp.Top))
		}
	}
	return n
}

// responseCache is the cache of a Server, nil when the policy leaves it
// off.
type responseCache = respcache.Cache[*cachedPrompt]

// newResponseCache returns the response cache of o's policy, its state
// exported on o.Metrics; nil when off.
func newResponseCache(o Options) (*responseCache, error) {
	rc := o.Policy.ResponseCache
	if !rc.On() {
		return nil, nil
	}
	c, err := respcache.New[*cachedPrompt](respcache.Options{Entries: rc.Entries, MaxBytes: rc.MaxBytesOrDefault(), TTL: rc.TTLOrDefault()})
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	o.Metrics.WatchResponseCache(c.Stats)
	return c, nil
}

// cachePartition returns the response cache partition of cl's requests:
// its key's digest, nil when the cache is shared across keys or the API
// has no keys.
func (s *Server) cachePartition(cl client) []byte {
	if s.o.Policy.ResponseCache.ShareAcrossKeys {
		return nil
	}
	if cl.fwd != nil && cl.fwd.Tenant != "" {
		return tenantDigest(cl.fwd.Tenant)
	}
	if cl.key == nil {
		return nil
	}
	d := cl.key.Digest()
	return d[:]
}

// cacheKey returns the key of req, a prompt of request p, and whether it
// may be cached: only a greedy (temperature 0) or seeded request, whose
// output the model, the prompt's tokens and the sampling parameters
// determine. An unseeded sampled request drew a random seed and is never
// cached. The key holds everything that shapes the Outputs: the route,
// the model, the prompt tokens, max_tokens, n, temperature, top_p, the
// seed (not for temperature 0, where it changes nothing), the penalties,
// ignore_eos, logprobs and prompt logprobs (echo with logprobs), and the
// stop strings (they end choices early). What only shapes the rendering
// (stream, include_usage, echo without logprobs, return_token_ids) is
// not in it: a hit renders the Outputs as the request asks.
//
// partition comes first: the digest of the request's API key, unless the
// policy shares the cache across keys (response_cache.share_across_keys)
// or there are no keys ("").
func cacheKey(p *params, req *Request, partition []byte) (respcache.Key, bool) {
	s := req.Sampling
	if s.Temperature != 0 && !p.seeded {
		return respcache.Key{}, false
	}
	h := sha256.New()
	str := func(v string) {
		putInt(h, int64(len(v)))
		h.Write([]byte(v))
	}
	f32 := func(v float32) { putInt(h, int64(math.Float32bits(v))) }
	str("pdserve response cache v2")
	str(string(partition))
	str(req.Route)
	str(req.Model)
	putInt(h, int64(len(req.Prompt)))
	for _, t := range req.Prompt {
		putInt(h, int64(t))
	}
	putInt(h, int64(req.MaxTokens))
	putInt(h, int64(req.N))
	f32(s.Temperature)
	f32(s.TopP)
	seed := s.Seed
	if s.Temperature == 0 {
		seed = 0
	}
	putInt(h, int64(seed))
	var pen sampling.Penalties
	if s.Penalties != nil {
		pen = *s.Penalties
	}
	f32(pen.Presence)
	f32(pen.Frequency)
	str(s.Grammar)
	eos := int64(0)
	if req.IgnoreEOS {
		eos = 1
	}
	putInt(h, eos)
	putInt(h, int64(req.Logprobs))
	putInt(h, int64(req.PromptLogprobs))
	putInt(h, int64(len(p.stops)))
	for _, st := range p.stops {
		str(st)
	}
	var k respcache.Key
	h.Sum(k[:0])
	return k, true
}

func putInt(h hash.Hash, v int64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	h.Write(b[:])
}

// completeCached runs pr through the response cache: a hit replays its
// outputs, a miss runs the Backend and records what the client took
// (stored by storeCached once the response completed). Without a cache,
// or for a request that cannot be cached, it is the Backend's Complete.
func (c *call) completeCached(ctx context.Context, pr *promptRun) ([]string, error) {
	cache := c.s.cache
	if cache == nil || !pr.cacheable {
		return c.s.o.Backend.Complete(ctx, pr.req, c.emitter(pr))
	}
	if e, ok := cache.Get(c.s.o.Now(), pr.key); ok {
		pr.req.Trace.Cache = budget.CacheHit
		return c.replay(pr, e)
	}
	pr.req.Trace.Cache = budget.CacheMiss
	pr.rec = &cachedPrompt{}
	finishes, err := c.s.o.Backend.Complete(ctx, pr.req, c.recorder(pr, c.emitter(pr)))
	pr.rec.finishes = slices.Clone(finishes)
	return finishes, err
}

// replay emits e's outputs to pr as its Backend did, skipping a choice's
// outputs once the emitter ended it on a stop string (there are none
// when the stop strings are those of the miss, as the key ensures).
func (c *call) replay(pr *promptRun, e *cachedPrompt) ([]string, error) {
	emit := c.emitter(pr)
	ended := make([]bool, len(pr.choices))
	for _, o := range e.outputs {
		if !o.Prompt && ended[o.Index] {
			continue
		}
		switch err := emit(o); {
		case errors.Is(err, ErrStopped):
			ended[o.Index] = true
		case err != nil:
			return nil, fmt.Errorf("frontend: response cache replay: %w", err)
		}
	}
	return slices.Clone(e.finishes), nil
}

// recorder wraps pr's emit to copy into pr.rec each Output the client
// took: every one emit accepted, including the one ending a choice on a
// stop string, none after it. The Backend's buffers are not kept.
func (c *call) recorder(pr *promptRun, emit EmitFunc) EmitFunc {
	ended := make([]bool, len(pr.choices))
	return func(o Output) error {
		err := emit(o)
		if err != nil && !errors.Is(err, ErrStopped) {
			return err
		}
		if !o.Prompt {
			if ended[o.Index] {
				return err
			}
			ended[o.Index] = err != nil
		}
		pr.rec.outputs = append(pr.rec.outputs, cloneOutput(o))
		return err
	}
}

func cloneOutput(o Output) Output {
	o.Tokens = slices.Clone(o.Tokens)
	o.Logprobs = slices.Clone(o.Logprobs)
	for i := range o.Logprobs {
		o.Logprobs[i].Top = slices.Clone(o.Logprobs[i].Top)
	}
	return o
}

// storeCached stores the recorded output of every prompt that missed.
// Call it only once the response completed: an error, a cancellation or
// a client that went away stores nothing.
func (c *call) storeCached() {
	if c.s.cache == nil {
		return
	}
	now := c.s.o.Now()
	for _, pr := range c.prompts {
		if pr.rec != nil && pr.err == nil {
			c.s.cache.Put(now, pr.key, pr.rec, pr.rec.size())
		}
	}
}
