package coordinator

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/frontend"
)

// How long, and how many, counted refusals are remembered: the OpenAI SDKs
// wait at most 60 s (a Retry-After they honour) between two tries, 8 s by
// their own backoff.
const (
	refusalTTL = time.Minute
	refusalCap = 4096
)

// refusalSet remembers the requests whose refusal the RefusalObservers
// were told of, so that a client's retry of one is not counted again: the
// OpenAI SDKs retry a 429 twice by default, which counted a refused
// request up to three times as demand. A retry is a request the client
// marks as one (frontend.Request.Retry ≥ 1, from X-Stainless-Retry-Count)
// with the same tenant, route, model, prompt, max_tokens and n as a
// refusal counted less than refusalTTL before; it is counted again once
// that has passed, so a client that keeps retrying counts once a minute.
// A request without the mark is always counted: the same prompt sent
// twice on purpose is two requests. At most refusalCap fingerprints (a
// SHA-256, never the prompt) are kept; the oldest go first. Safe for
// concurrent use.
type refusalSet struct {
	now     func() time.Time
	retries prometheus.Counter // retries not counted again

	mu    sync.Mutex
	at    map[[sha256.Size]byte]time.Time // fingerprint → when counted
	order []refusalEntry                  // in the order counted
}

type refusalEntry struct {
	fp [sha256.Size]byte
	at time.Time
}

func newRefusalSet(reg prometheus.Registerer, now func() time.Time) *refusalSet {
	s := &refusalSet{now: now, at: map[[sha256.Size]byte]time.Time{},
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pdserve_planner_refusal_retries_total",
			Help: "Retries of a request whose refusal (429) the planner already counted as demand (X-Stainless-Retry-Count of 1 or more, the same tenant, model, prompt and max_tokens, within a minute), not counted as demand again: refused again, forwarded to another region or served here (then observed for its measured terms only).",
		})}
	if reg != nil {
		reg.MustRegister(s.retries)
	}
	return s
}

// first reports whether req's refusal is to be counted: false for a retry
// of a refusal counted within refusalTTL. A counted one is remembered.
func (s *refusalSet) first(req *frontend.Request) bool {
	fp := fingerprint(req)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.order) > 0 && (len(s.at) >= refusalCap || now.Sub(s.order[0].at) >= refusalTTL) {
		old := s.order[0]
		s.order = s.order[1:]
		if s.at[old.fp] == old.at {
			delete(s.at, old.fp)
		}
	}
	if s.retryLocked(req, fp, now) {
		return false
	}
	s.at[fp] = now
	s.order = append(s.order, refusalEntry{fp, now})
	return true
}

// retried reports whether req retries a refusal counted within
// refusalTTL (as first would leave it out); it remembers nothing.
func (s *refusalSet) retried(req *frontend.Request) bool {
	if req.Retry == 0 {
		return false
	}
	fp := fingerprint(req)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retryLocked(req, fp, now)
}

// retryLocked reports whether req, of fingerprint fp, is a marked retry
// of a refusal counted within refusalTTL before now, and counts it in
// pdserve_planner_refusal_retries_total if so. s.mu is held.
func (s *refusalSet) retryLocked(req *frontend.Request, fp [sha256.Size]byte, now time.Time) bool {
	at, ok := s.at[fp]
	if !ok || req.Retry == 0 || now.Sub(at) >= refusalTTL {
		return false
	}
	s.retries.Inc()
	return true
}

// fingerprint digests what makes two tries one request: the tenant, the
// route, the model, max_tokens, n and the prompt's tokens.
func fingerprint(req *frontend.Request) [sha256.Size]byte {
	h := sha256.New()
	for _, s := range []string{req.Tenant, req.Route, req.Model} {
		h.Write(binary.AppendUvarint(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	b := binary.AppendUvarint(nil, uint64(req.MaxTokens))
	b = binary.AppendUvarint(b, uint64(req.N))
	b = binary.AppendUvarint(b, uint64(len(req.Prompt)))
	for _, t := range req.Prompt {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	h.Write(b)
	var fp [sha256.Size]byte
	h.Sum(fp[:0])
	return fp
}
