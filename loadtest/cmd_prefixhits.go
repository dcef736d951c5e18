package main

import (
	"container/list"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/pkg/workload"
)

// mooncakeBlockTokens is the tokens a Mooncake hash id names (Qin et al.,
// FAST 2025).
const mooncakeBlockTokens = 512

// prefixHitsOptions are the flags of `loadtest prefix-hits`.
type prefixHitsOptions struct {
	DatasetPath string
	Tenants     []int
	CacheTokens int64
}

// cmdPrefixHits is `loadtest prefix-hits`: the prefix-cache hit ratio of
// a Mooncake trace replayed through one cache, its requests spread over
// each number of tenants whose caches are apart (tenant-rooted hashes).
func cmdPrefixHits(_ context.Context, args []string, stdout, stderr io.Writer) error {
	o := prefixHitsOptions{Tenants: []int{1, 4, 16}}
	fs := flag.NewFlagSet("prefix-hits", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "prefix-hits --dataset-path TRACE.jsonl [flags]",
		"Replay a Mooncake trace's hash ids (512-token blocks) in file order through a prefix\n"+
			"cache and print the hit ratio (prompt tokens served from the cache over all prompt\n"+
			"tokens; whole blocks, each prompt's last token always computed) with the requests\n"+
			"spread round-robin over each number of tenants: request i belongs to tenant i mod N,\n"+
			"and a tenant's blocks match only its own (pdserve roots each tenant's block hashes\n"+
			"apart). The cache is one LRU of --cache-tokens shared by all tenants (0: unbounded).\n"+
			"Nothing is sent to a server.",
		"  go run ./loadtest prefix-hits --dataset-path data/mooncake-fast25/synthetic_trace.jsonl --tenants 1,4,16\n")
	fs.StringVar(&o.DatasetPath, "dataset-path", o.DatasetPath, "dataset file (sharegpt JSON, azure CSV, mooncake JSONL)") // prefix-hits takes Mooncake JSONL only
	fs.Func("tenants", "comma-separated numbers of tenants to spread the requests over (default 1,4,16)", func(s string) error {
		var ns []int
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("%q is not a positive number of tenants", f)
			}
			ns = append(ns, n)
		}
		o.Tenants = ns
		return nil
	})
	fs.Int64Var(&o.CacheTokens, "cache-tokens", o.CacheTokens, "prefix cache capacity in tokens, LRU by 512-token block, shared by all tenants (0: unbounded)")
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if o.DatasetPath == "" {
		return fmt.Errorf("%w: --dataset-path is required", errUsage)
	}
	if o.CacheTokens < 0 {
		return fmt.Errorf("%w: --cache-tokens %d must not be negative", errUsage, o.CacheTokens)
	}
	f, err := os.Open(o.DatasetPath)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, err := workload.ParseMooncake(f)
	if err != nil {
		return err
	}
	if !hasHashIDs(rows) {
		return fmt.Errorf("%w: %s names no blocks (hash_ids)", errUsage, o.DatasetPath)
	}
	capacity := "unbounded"
	if o.CacheTokens > 0 {
		capacity = fmt.Sprintf("%d tokens", o.CacheTokens)
	}
	fmt.Fprintf(stdout, "%s: %d requests, cache %s, requests to tenants round-robin\n", o.DatasetPath, len(rows), capacity)
	fmt.Fprintf(stdout, "%8s  %9s  %14s  %14s\n", "tenants", "hit ratio", "hit tokens", "prompt tokens")
	for _, n := range o.Tenants {
		r := prefixHits(rows, n, o.CacheTokens/mooncakeBlockTokens, o.CacheTokens == 0)
		fmt.Fprintf(stdout, "%8d  %9.4f  %14d  %14d\n", n, r.ratio(), r.hit, r.all)
	}
	fmt.Fprintln(stdout, "Trace: Qin et al., Mooncake, FAST 2025 (Apache-2.0).")
	return nil
}

func hasHashIDs(rows []workload.TraceRow) bool {
	for _, r := range rows {
		if len(r.HashIDs) > 0 {
			return true
		}
	}
	return false
}

// hitCount is prompt tokens served from the cache (hit) of all.
type hitCount struct{ hit, all int64 }

func (h hitCount) ratio() float64 {
	if h.all == 0 {
		return 0
	}
	return float64(h.hit) / float64(h.all)
}

// tenantBlock is a block as a tenant's cache names it: a Mooncake hash id
// stands for its whole prefix, and a tenant's root makes its chain its
// own.
type tenantBlock struct {
	tenant int
	id     int64
}

// prefixHits replays rows in order, request i as tenant i mod tenants,
// through one LRU cache of capBlocks blocks (unbounded: no limit). A
// request hits its leading full blocks the cache holds for its tenant,
// capped to leave its last token to compute, as a worker's cache does;
// then its full blocks are cached, the first the most recently used, so
// that eviction takes a chain's tail before its head.
func prefixHits(rows []workload.TraceRow, tenants int, capBlocks int64, unbounded bool) hitCount {
	var h hitCount
	lru := list.New() // of tenantBlock, front = most recent
	at := map[tenantBlock]*list.Element{}
	for i, r := range rows {
		t := i % tenants
		full := r.HashIDs[:min(len(r.HashIDs), r.InputLen/mooncakeBlockTokens)]
		n := 0
		for n < len(full) && at[tenantBlock{t, full[n]}] != nil {
			n++
		}
		h.hit += int64(min(n*mooncakeBlockTokens, r.InputLen-1))
		h.all += int64(r.InputLen)
		for j := len(full) - 1; j >= 0; j-- {
			b := tenantBlock{t, full[j]}
			if el := at[b]; el != nil {
				lru.MoveToFront(el)
				continue
			}
			at[b] = lru.PushFront(b)
		}
		for !unbounded && int64(lru.Len()) > capBlocks {
			el := lru.Back()
			delete(at, el.Value.(tenantBlock))
			lru.Remove(el)
		}
	}
	return h
}
