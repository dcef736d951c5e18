package coordinator

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"

	"github.com/pdserve/pdserve/pkg/config"
)

// PolicyFlag is a former flag of a setting the policy file holds
// (limits, routing, pricing, the response cache): the policy is the one
// place of those settings. Kept for one release, it still works: given,
// it sets Key of the policy (after the file loads, so it wins over the
// file), and the coordinator logs Deprecation at start.
type PolicyFlag struct {
	Name string // the flag, without dashes
	Key  string // the policy's key it sets, e.g. "limits.queue_limit"
	// parse reads the flag's value and returns the edit of the policy
	// it stands for.
	parse func(v string) (func(*config.Policy), error)
	bool  bool // a boolean flag (--name alone means true)
}

// Deprecation is the warning logged at start for a PolicyFlag given.
func (f PolicyFlag) Deprecation() string {
	return fmt.Sprintf("flag --%s is deprecated, set %s in the --policy file", f.Name, f.Key)
}

// PolicyFlags are the coordinator's former flags of policy settings.
var PolicyFlags = []PolicyFlag{
	{Name: "max-tokens-cap", Key: "limits.max_tokens_cap", parse: intEdit(0, func(p *config.Policy, n int) {
		p.Limits.MaxTokensCap = n
		if n > 0 {
			p.Limits.DefaultMaxTokens = min(p.Limits.DefaultMaxTokens, n)
		}
	})},
	{Name: "max-admitted-requests", Key: "limits.queue_limit", parse: intEdit(1, func(p *config.Policy, n int) { p.Limits.QueueLimit = n })},
	{Name: "queue-limit", Key: "limits.queue_limit", parse: intEdit(1, func(p *config.Policy, n int) { p.Limits.QueueLimit = n })},
	{Name: "local-prefill-tokens", Key: "routing.local_prefill_below_tokens", parse: intEdit(0, func(p *config.Policy, n int) { p.Routing.LocalPrefillBelowTokens = n })},
	{Name: "response-cache-entries", Key: "response_cache.entries", parse: intEdit(0, func(p *config.Policy, n int) { p.ResponseCache.Entries = n })},
	{Name: "response-cache-share-across-keys", Key: "response_cache.share_across_keys", bool: true, parse: func(v string) (func(*config.Policy), error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errors.New("not a boolean")
		}
		return func(p *config.Policy) { p.ResponseCache.ShareAcrossKeys = b }, nil
	}},
	{Name: "gpu-cost-per-hour", Key: "pricing.gpu_usd_per_hour", parse: func(v string) (func(*config.Policy), error) {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || !(x >= 0) || math.IsInf(x, 0) {
			return nil, errors.New("must be a finite number ≥ 0 (USD per GPU-hour)")
		}
		return func(p *config.Policy) { p.Pricing.GPUUSDPerHour = x }, nil
	}},
}

// intEdit parses an integer ≥ least and returns set with it.
func intEdit(least int, set func(*config.Policy, int)) func(string) (func(*config.Policy), error) {
	return func(v string) (func(*config.Policy), error) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, errors.New("not an integer")
		}
		if n < least {
			return nil, fmt.Errorf("must be ≥ %d", least)
		}
		return func(p *config.Policy) { set(p, n) }, nil
	}
}

// addPolicyFlags registers PolicyFlags on fs: each given appends its
// edit to o.PolicyEdits, which Complete applies to the policy.
func (o *Options) addPolicyFlags(fs *flag.FlagSet) {
	for _, f := range PolicyFlags {
		fs.Var(&policyFlagValue{f: f, o: o}, f.Name, fmt.Sprintf("deprecated: sets %s of the --policy file, which says it once", f.Key))
	}
}

// policyFlagValue is a PolicyFlag on a flag set.
type policyFlagValue struct {
	f   PolicyFlag
	o   *Options
	raw string
}

func (v *policyFlagValue) String() string {
	if v == nil {
		return ""
	}
	return v.raw
}

// Set appends the flag's edit to PolicyEdits; a second flag of the same
// key given another value is an error naming both.
func (v *policyFlagValue) Set(s string) error {
	edit, err := v.f.parse(s)
	if err != nil {
		return err
	}
	if v.o.policyFlagsSet == nil {
		v.o.policyFlagsSet = map[string]*policyFlagValue{}
	}
	if other := v.o.policyFlagsSet[v.f.Key]; other != nil && other != v && other.raw != s {
		return fmt.Errorf("--%s %s was given too: both set %s; give one", other.f.Name, other.raw, v.f.Key)
	}
	v.o.policyFlagsSet[v.f.Key] = v
	v.raw = s
	v.o.PolicyEdits = append(v.o.PolicyEdits, edit)
	return nil
}

func (v *policyFlagValue) IsBoolFlag() bool { return v.f.bool }

// PolicyFlagsGiven returns the PolicyFlags fs was given, in PolicyFlags'
// order, for their deprecation warnings.
func PolicyFlagsGiven(fs *flag.FlagSet) []PolicyFlag {
	var given []PolicyFlag
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, f := range PolicyFlags {
		if set[f.Name] {
			given = append(given, f)
		}
	}
	return given
}
