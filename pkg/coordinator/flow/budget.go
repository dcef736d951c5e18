package flow

import (
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
)

// Budget is the flow's part of a request's budget (budget.Trace's fields
// of the same names, which only the flow writes): the workers, the
// placement, the workers' stamps and counts. A value; Record actions
// carry it.
type Budget struct {
	Mode, FirstTokenPolicy                  string
	Routed                                  time.Time
	PrefillQueued, PrefillStart, PrefillEnd time.Time
	KVFirstByte, KVDone, DecodeJoined       time.Time
	BatchSize, PrefillBatch                 int
	PrefixHitTokens                         int
	HostHitTokens                           int
	HostLoad                                time.Duration
	DiskHitTokens                           int
	PeerHitTokens                           int
	PeerLoad                                time.Duration
	DecodePrefixHitTokens                   int
	RoutedPrefixHitTokens                   int
	KVBytesRaw, KVBytesWire                 int64
	Codec, CodecReason                      string
	PrefillWorker, DecodeWorker             string
	Recoveries, PrefillRetries              int
}

// Apply writes b into t's fields of the same names.
func (b Budget) Apply(t *budget.Trace) {
	t.Mode, t.FirstTokenPolicy = b.Mode, b.FirstTokenPolicy
	t.Routed = b.Routed
	t.PrefillQueued, t.PrefillStart, t.PrefillEnd = b.PrefillQueued, b.PrefillStart, b.PrefillEnd
	t.KVFirstByte, t.KVDone, t.DecodeJoined = b.KVFirstByte, b.KVDone, b.DecodeJoined
	t.BatchSize, t.PrefillBatch = b.BatchSize, b.PrefillBatch
	t.PrefixHitTokens = b.PrefixHitTokens
	t.HostHitTokens, t.HostLoad = b.HostHitTokens, b.HostLoad
	t.DiskHitTokens = b.DiskHitTokens
	t.PeerHitTokens, t.PeerLoad = b.PeerHitTokens, b.PeerLoad
	t.DecodePrefixHitTokens = b.DecodePrefixHitTokens
	t.RoutedPrefixHitTokens = b.RoutedPrefixHitTokens
	t.KVBytesRaw, t.KVBytesWire = b.KVBytesRaw, b.KVBytesWire
	t.Codec, t.CodecReason = b.Codec, b.CodecReason
	t.PrefillWorker, t.DecodeWorker = b.PrefillWorker, b.DecodeWorker
	t.Recoveries, t.PrefillRetries = b.Recoveries, b.PrefillRetries
}

// setHits sets the prefix hit of the worker that prefills.
func (b *Budget) setHits(h Hits) {
	b.PrefixHitTokens, b.HostHitTokens, b.HostLoad = h.Prefix, h.Host, h.HostLoad
	b.DiskHitTokens, b.PeerHitTokens, b.PeerLoad = h.Disk, h.Peer, h.PeerLoad
}

// setOnce sets *t to at unless it is set or at is zero.
func setOnce(t *time.Time, at time.Time) {
	if t.IsZero() && !at.IsZero() {
		*t = at
	}
}
