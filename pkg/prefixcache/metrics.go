package prefixcache

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns a worker's prefix cache collectors, read from stats
// at each scrape, named pdserve_<subsystem>_prefix_cache_*:
//
//	lookups_total     counter  prompts looked up
//	hits_total        counter  lookups that hit at least one block (hit rate: hits / lookups)
//	hit_tokens_total  counter  prompt tokens taken from the cache: prefill tokens saved
//	evictions_total   counter  entries evicted for the bounds
//	reclaims_total    counter  entries evicted to give their KV to requests
//	tokens            gauge    KV tokens held by cached sequences
//	entries           gauge    cached engine sequences
//
// and, per tier (label tier="host" with a host tier, tier="disk" with a
// disk tier), named
// pdserve_<subsystem>_prefix_cache_tier_*:
//
//	lookups_total        counter  prompts looked up in the tier
//	hits_total           counter  loads of at least one block
//	hit_tokens_total     counter  prompt tokens loaded: prefill tokens saved
//	spills_total         counter  engine entries copied in
//	evictions_total      counter  entries evicted for the byte budget
//	bad_entries_total    counter  disk tier only: entries dropped for a bad file (wrong type, size or checksum)
//	load_seconds_total   counter  time loads took (modeled on the sim engine)
//	bytes                gauge    KV bytes held (the model's true size)
//	blocks               gauge    distinct blocks held
//	entries              gauge    entries held
//
// and the pulls of prefixes from peer workers and the exports to them,
// named pdserve_<subsystem>_prefix_cache_peer_*:
//
//	pulls_total          counter  pulls that brought at least one block
//	pull_failures_total  counter  pulls that failed (the prefix was computed)
//	pulls_skipped_total  counter  prefixes faster to compute than to pull
//	pulled_tokens_total  counter  tokens pulled
//	pulled_bytes_total   counter  KV bytes pulled (as received, decoded)
//	hit_tokens_total     counter  pulled tokens a prompt started from: prefill tokens saved
//	pull_seconds_total   counter  time the pulls and their imports took
//	exports_total        counter  prefixes sent to peers
//	export_tokens_total  counter  tokens sent to peers
//	verified_total       counter  pulls whose spot check matched
//	rejected_total       counter  pulls whose spot check did not match (dropped, computed here)
//	unverified_total     counter  pulled prefixes used unchecked for their request only, not cached
//	check_tokens_total   counter  prompt tokens the spot checks recomputed
//	check_seconds_total  counter  time the spot checks took
//	purged_total         counter  cached entries dropped when their peer failed a spot check
//
// Each worker package registers them from its metrics.go; host and disk
// tell whether the cache has a host tier (Cache.Host not nil) and a disk
// tier (Host.Disk not nil).
func Collectors(subsystem string, stats func() Stats, host, disk bool) []prometheus.Collector {
	name := func(s string) string { return "pdserve_" + subsystem + "_prefix_cache_" + s }
	counter := func(n, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name(n), Help: help}, func() float64 { return float64(f(stats())) })
	}
	gauge := func(n, help string, f func(Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name(n), Help: help}, func() float64 { return float64(f(stats())) })
	}
	cs := []prometheus.Collector{
		counter("lookups_total", "Prompts looked up in the prefix cache.", func(s Stats) uint64 { return s.Lookups }),
		counter("hits_total", "Prefix cache lookups that hit at least one block.", func(s Stats) uint64 { return s.Hits }),
		counter("hit_tokens_total", "Prompt tokens taken from the prefix cache instead of computed (prefill tokens saved).", func(s Stats) uint64 { return s.HitTokens }),
		counter("evictions_total", "Prefix cache entries evicted for its bounds.", func(s Stats) uint64 { return s.Evictions }),
		counter("reclaims_total", "Prefix cache entries evicted to give their KV blocks to requests.", func(s Stats) uint64 { return s.Reclaims }),
		gauge("tokens", "KV tokens held by the prefix cache's sequences.", func(s Stats) int { return s.Tokens }),
		gauge("entries", "Engine sequences held by the prefix cache.", func(s Stats) int { return s.Entries }),
	}
	peer := func(n, help string, f func(PeerStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name("peer_" + n), Help: help}, func() float64 { return f(stats().Peer) })
	}
	cs = append(cs,
		peer("pulls_total", "Pulls of a cached prefix from a peer worker that brought at least one block.", func(s PeerStats) float64 { return float64(s.Pulls) }),
		peer("pull_failures_total", "Pulls of a cached prefix from a peer worker that failed (the prefix was computed).", func(s PeerStats) float64 { return float64(s.PullFailures) }),
		peer("pulls_skipped_total", "Prefixes a peer worker held that were faster to compute than to pull.", func(s PeerStats) float64 { return float64(s.PullsSkipped) }),
		peer("pulled_tokens_total", "Prompt tokens of KV pulled from peer workers.", func(s PeerStats) float64 { return float64(s.PulledTokens) }),
		peer("pulled_bytes_total", "KV bytes pulled from peer workers (decoded, as received).", func(s PeerStats) float64 { return float64(s.PulledBytes) }),
		peer("hit_tokens_total", "Pulled prompt tokens a prompt started from instead of computing them (prefill tokens saved).", func(s PeerStats) float64 { return float64(s.HitTokens) }),
		peer("pull_seconds_total", "Time pulls from peer workers and their imports took.", func(s PeerStats) float64 { return s.PullTime.Seconds() }),
		peer("exports_total", "Cached prefixes sent to peer workers.", func(s PeerStats) float64 { return float64(s.Exports) }),
		peer("export_tokens_total", "Prompt tokens of cached KV sent to peer workers.", func(s PeerStats) float64 { return float64(s.ExportTokens) }),
		peer("verified_total", "Pulls from peer workers whose spot check (sampled blocks recomputed here) matched.", func(s PeerStats) float64 { return float64(s.Verified) }),
		peer("rejected_total", "Pulls from peer workers whose spot check did not match: the KV was dropped and the prompt computed here.", func(s PeerStats) float64 { return float64(s.Rejected) }),
		peer("unverified_total", "Pulled prefixes used unchecked for their own request only, never cached.", func(s PeerStats) float64 { return float64(s.Unverified) }),
		peer("check_tokens_total", "Prompt tokens recomputed by spot checks of pulled KV.", func(s PeerStats) float64 { return float64(s.CheckTokens) }),
		peer("check_seconds_total", "Time spot checks of pulled KV took.", func(s PeerStats) float64 { return s.CheckTime.Seconds() }),
		peer("purged_total", "Cached entries dropped because the peer they were pulled from failed a later spot check.", func(s PeerStats) float64 { return float64(s.Purged) }),
	)
	if host {
		cs = append(cs, tierCollectors(name, "host", func() HostStats { return stats().Host })...)
	}
	if host && disk {
		cs = append(cs, tierCollectors(name, "disk", func() HostStats { return stats().Disk })...)
	}
	return cs
}

// tierCollectors are the collectors of one tier, labelled tier=tierName.
func tierCollectors(name func(string) string, tierName string, stats func() HostStats) []prometheus.Collector {
	tier := prometheus.Labels{"tier": tierName}
	hcounter := func(n, help string, f func(HostStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name("tier_" + n), Help: help, ConstLabels: tier}, func() float64 { return f(stats()) })
	}
	hgauge := func(n, help string, f func(HostStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("tier_" + n), Help: help, ConstLabels: tier}, func() float64 { return f(stats()) })
	}
	cs := []prometheus.Collector{
		hcounter("lookups_total", "Prompts looked up in the prefix cache tier.", func(s HostStats) float64 { return float64(s.Lookups) }),
		hcounter("hits_total", "Prefix cache tier loads of at least one block.", func(s HostStats) float64 { return float64(s.Hits) }),
		hcounter("hit_tokens_total", "Prompt tokens loaded from the prefix cache tier instead of computed.", func(s HostStats) float64 { return float64(s.HitTokens) }),
		hcounter("spills_total", "Evicted engine entries copied into the prefix cache tier.", func(s HostStats) float64 { return float64(s.Spills) }),
		hcounter("evictions_total", "Prefix cache tier entries evicted for its byte budget.", func(s HostStats) float64 { return float64(s.Evictions) }),
		hcounter("load_seconds_total", "Time prefix cache tier loads took (the modeled host-link time on the performance-model engine).", func(s HostStats) float64 { return s.LoadTime.Seconds() }),
		hgauge("bytes", "KV bytes held by the prefix cache tier (the model's true size).", func(s HostStats) float64 { return float64(s.Bytes) }),
		hgauge("budget_bytes", "The prefix cache tier's byte budget (--host-cache-bytes, --disk-cache-bytes).", func(s HostStats) float64 { return float64(s.Budget) }),
		hgauge("blocks", "Distinct KV blocks held by the prefix cache tier.", func(s HostStats) float64 { return float64(s.Blocks) }),
		hgauge("entries", "Entries held by the prefix cache tier.", func(s HostStats) float64 { return float64(s.Entries) }),
	}
	if tierName == "disk" {
		cs = append(cs, hcounter("bad_entries_total", "Disk tier entries dropped for a bad file: not a regular file, the wrong size or a failed checksum (their prefixes were computed).", func(s HostStats) float64 { return float64(s.BadEntries) }))
	}
	return cs
}
