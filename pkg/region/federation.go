package region

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/tiers"
)

// The federation's subjects; they cross the gateways between regions.
const (
	// SummarySubject carries every coordinator's Summary.
	SummarySubject = control.RegionPrefix + "summary"
	pingPrefix     = control.RegionPrefix + "ping."
	pongPrefix     = control.RegionPrefix + "pong."
)

// Bounds on what a peer's summary may hold; a summary over them is
// dropped.
const (
	maxModels      = 256
	maxTierModels  = 16
	maxSummaryName = 256
)

// Summary is what a coordinator tells the other regions about its own,
// published every interval on SummarySubject.
type Summary struct {
	Region string `json:"region"`
	// URL is where peers forward requests (Options.AdvertiseURL as bound).
	URL    string         `json:"url"`
	Models []ModelSummary `json:"models"`
	// Tiers are the region's tier aliases and their models, in order.
	Tiers map[string][]string `json:"tiers,omitempty"`
	// InFlight are the requests the coordinator holds now (a load
	// summary; Place does not use it).
	InFlight int `json:"in_flight"`
}

// ModelSummary is one served model's state and learnt TTFT terms.
type ModelSummary struct {
	Name string `json:"name"`
	tiers.Live
	// Terms are nil while the model has served nothing here.
	Terms *tiers.Terms `json:"terms,omitempty"`
}

// Predict returns the model's predicted TTFT for a prompt of
// promptTokens: unmeasured (zero) without terms.
func (m ModelSummary) Predict(promptTokens int) tiers.Prediction {
	if m.Terms == nil {
		return tiers.Prediction{}
	}
	return m.Terms.Predict(promptTokens, m.QueuedPrefillTokens)
}

// validate checks a peer's summary against the bounds.
func (s Summary) validate() error {
	if control.ValidToken(s.Region) != nil || len(s.Region) > maxSummaryName {
		return errors.New("bad region name")
	}
	if len(s.Models) > maxModels || len(s.Tiers) > maxModels {
		return errors.New("too many models or tiers")
	}
	for _, m := range s.Tiers {
		if len(m) > maxTierModels {
			return errors.New("too many models in a tier")
		}
	}
	return nil
}

// Peer is another region as this one knows it.
type Peer struct {
	Summary
	// Seen is when its last summary arrived.
	Seen time.Time
	// RTT is the round trip to its coordinator: the least of the last
	// rttSamples probes, as the link's own delay is the floor under what
	// each probe took and queueing in either process only adds to it (a
	// mean of busy processes' probes made a near region look far); 0
	// until measured.
	RTT time.Duration
	// rtts are the last probes' round trips, nrtt how many were taken.
	rtts [rttSamples]time.Duration
	nrtt int
}

// Config configures a Federation.
type Config struct {
	// Name is this region's.
	Name string
	// Local returns this region's summary now (Region is set by Start).
	Local func() Summary
	// Interval is how often the summary and the probes go out; ≤ 0: 1 s.
	Interval time.Duration
	// TTL: a region not heard from for this long is gone; ≤ 0: 3 ×
	// Interval.
	TTL time.Duration
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// rttSamples is how many recent probes a peer's RTT is the least of: at
// the default interval, the last 8 s.
const rttSamples = 8

// Federation publishes this region's summary and keeps the others'.
type Federation struct {
	cfg  Config
	nc   *nats.Conn
	subs []*nats.Subscription
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	peers map[string]*Peer
}

// probe is the ping and pong payload: the origin's name and clock, and
// in the pong the region that answered.
type probe struct {
	From string `json:"from"`
	Sent int64  `json:"sent_unix_nano"`
	By   string `json:"by,omitempty"`
}

// Start subscribes to the federation's subjects on nc and starts
// publishing. Stop ends it. Errors: a bad name, subscription errors.
func Start(nc *nats.Conn, cfg Config) (*Federation, error) {
	if err := control.ValidToken(cfg.Name); err != nil {
		return nil, fmt.Errorf("region: name: %w", err)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 3 * cfg.Interval
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	f := &Federation{cfg: cfg, nc: nc, peers: map[string]*Peer{}, stop: make(chan struct{}), done: make(chan struct{})}
	subs := []struct {
		subj string
		h    nats.MsgHandler
	}{
		{SummarySubject, f.onSummary},
		{pingPrefix + cfg.Name, f.onPing},
		{pongPrefix + cfg.Name, f.onPong},
	}
	for _, s := range subs {
		sub, err := nc.Subscribe(s.subj, s.h)
		if err != nil {
			f.unsubscribe()
			return nil, fmt.Errorf("region: subscribe %s: %w", s.subj, err)
		}
		f.subs = append(f.subs, sub)
	}
	go f.run()
	return f, nil
}

func (f *Federation) unsubscribe() {
	for _, s := range f.subs {
		_ = s.Unsubscribe() // a closed connection has none left
	}
}

// Stop stops publishing and unsubscribes; it returns once the publisher
// stopped.
func (f *Federation) Stop() {
	close(f.stop)
	<-f.done
	f.unsubscribe()
}

func (f *Federation) run() {
	defer close(f.done)
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		f.publish()
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
	}
}

// publish sends this region's summary and a probe to each live peer.
func (f *Federation) publish() {
	s := f.cfg.Local()
	s.Region = f.cfg.Name
	b, err := json.Marshal(s)
	if err == nil {
		err = f.nc.Publish(SummarySubject, b)
	}
	if err != nil {
		f.cfg.Logger.Debug("region summary not published", zap.Error(err))
	}
	p, _ := json.Marshal(probe{From: f.cfg.Name, Sent: time.Now().UnixNano()})
	for _, peer := range f.Peers() {
		_ = f.nc.Publish(pingPrefix+peer.Region, p) // a lost probe is a sample less
	}
}

func (f *Federation) onSummary(m *nats.Msg) {
	var s Summary
	if err := json.Unmarshal(m.Data, &s); err != nil || s.validate() != nil {
		f.cfg.Logger.Debug("region summary dropped: invalid", zap.Int("bytes", len(m.Data)))
		return
	}
	if s.Region == f.cfg.Name {
		return // our own, or another coordinator of this region
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.peers[s.Region]
	if p == nil {
		p = &Peer{}
		f.peers[s.Region] = p
		f.cfg.Logger.Info("region joined", zap.String("region", s.Region), zap.String("url", s.URL))
	}
	p.Summary, p.Seen = s, time.Now()
}

func (f *Federation) onPing(m *nats.Msg) {
	var p probe
	if json.Unmarshal(m.Data, &p) != nil || control.ValidToken(p.From) != nil {
		return
	}
	p.By = f.cfg.Name
	b, _ := json.Marshal(p)
	_ = f.nc.Publish(pongPrefix+p.From, b)
}

func (f *Federation) onPong(m *nats.Msg) {
	var p probe
	if json.Unmarshal(m.Data, &p) != nil {
		return
	}
	rtt := time.Since(time.Unix(0, p.Sent))
	if rtt <= 0 || rtt > f.cfg.TTL {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	peer := f.peers[p.By]
	if peer == nil {
		return
	}
	peer.observeRTT(rtt)
}

// observeRTT takes one probe's round trip.
func (p *Peer) observeRTT(rtt time.Duration) {
	p.rtts[p.nrtt%rttSamples] = rtt
	p.nrtt++
	p.RTT = slices.Min(p.rtts[:min(p.nrtt, rttSamples)])
}

// Peers returns the regions heard from within the TTL, by name.
func (f *Federation) Peers() []Peer {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Peer, 0, len(f.peers))
	for name, p := range f.peers {
		if now.Sub(p.Seen) > f.cfg.TTL {
			delete(f.peers, name)
			f.cfg.Logger.Info("region gone: no summary within the TTL", zap.String("region", name), zap.Duration("ttl", f.cfg.TTL))
			continue
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Peer) int {
		switch {
		case a.Region < b.Region:
			return -1
		case a.Region > b.Region:
			return 1
		}
		return 0
	})
	return out
}
