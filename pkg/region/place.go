package region

import (
	"slices"
	"time"
)

// Local is this region's state for one request: whether its model is up
// here, and its predicted TTFT here.
type Local struct {
	Up bool
	// Predicted is the predicted TTFT here; Measured false when the model
	// served nothing yet here (then it is taken as fitting).
	Predicted time.Duration
	Measured  bool
}

// Candidate is a peer that may serve a request.
type Candidate struct {
	Region, URL string
	// Predicted is the peer's predicted TTFT for the prompt (0 when
	// unmeasured) and RTT the round trip to it; Cost their sum.
	Predicted, RTT time.Duration
	Measured       bool
}

// Cost is the predicted TTFT seen from here: the peer's prediction plus
// the round trip to it.
func (c Candidate) Cost() time.Duration { return c.Predicted + c.RTT }

// Candidates returns the peers that serve model (a model, a tier alias of
// theirs, or "" for their default model) now: up and not shedding, each with its predicted TTFT for
// a prompt of promptTokens (a tier's best model's), and the RTT to it.
func Candidates(peers []Peer, model string, promptTokens int) []Candidate {
	var out []Candidate
	for _, p := range peers {
		if p.URL == "" {
			continue
		}
		names := []string{model}
		if t, ok := p.Tiers[model]; ok && !slices.ContainsFunc(p.Models, func(m ModelSummary) bool { return m.Name == model }) {
			names = t
		}
		best, found := Candidate{}, false
		for _, m := range p.Models {
			// A request naming no model takes the peer's default, its
			// first model.
			named := slices.Contains(names, m.Name) || (model == "" && m.Name == p.Models[0].Name)
			if !named || !m.Up || m.Shedding {
				continue
			}
			pr := m.Predict(promptTokens)
			c := Candidate{Region: p.Region, URL: p.URL, Predicted: pr.TTFT(), Measured: pr.Measured, RTT: p.RTT}
			if !found || better(c, best) {
				best, found = c, true
			}
		}
		if found {
			out = append(out, best)
		}
	}
	return out
}

// better orders candidates: lower cost first (an unmeasured one costs its
// RTT), then by name.
func better(a, b Candidate) bool {
	if a.Cost() != b.Cost() {
		return a.Cost() < b.Cost()
	}
	return a.Region < b.Region
}

// Place returns where a request with the TTFT budget (0: none) goes, in
// the order to try: none (serve here) when this region is up and
// predicted within the budget (or unmeasured, or there is no budget).
// Otherwise the candidates whose cost fits the budget, best first; when
// none fits, the best candidate if it beats this region (or this region
// is down). When this region is up it remains the last resort, after the
// list; when it is down and no candidate is left the request fails here.
func Place(local Local, budget time.Duration, cands []Candidate) []Candidate {
	if local.Up && (budget <= 0 || !local.Measured || local.Predicted <= budget) {
		return nil
	}
	cands = slices.Clone(cands)
	slices.SortFunc(cands, func(a, b Candidate) int {
		if better(a, b) {
			return -1
		}
		if better(b, a) {
			return 1
		}
		return 0
	})
	var fit []Candidate
	for _, c := range cands {
		if budget <= 0 || c.Cost() <= budget {
			fit = append(fit, c)
		}
	}
	if len(fit) > 0 {
		return fit
	}
	if len(cands) > 0 && (!local.Up || cands[0].Cost() < local.Predicted) {
		if !local.Up {
			return cands // down here: any region beats none
		}
		return cands[:1]
	}
	return nil
}
