package planner

import (
	"context"
	"fmt"
	"time"
)

// RoleOptions make Online move workers between the prefill and decode
// pools (elastic workers, which change role without reloading their
// model) before it changes their total. Zero fields take the defaults in
// brackets.
type RoleOptions struct {
	// Enabled turns role moves on.
	Enabled bool
	// MinDwell is the least time between two role moves [2m]: a worker
	// moved serves its new role at least this long.
	MinDwell time.Duration
	// MinGain is the predicted attainment gain (a fraction, at the
	// planned rate) a move must bring [0.02].
	MinGain float64
}

// RoleActuator moves workers between roles (see package plannerhost).
type RoleActuator interface {
	// MoveRoles moves n workers of role from to role to.
	MoveRoles(ctx context.Context, from, to string, n int) error
}

// RoleDecision is what one re-plan decided about the roles of the live
// workers, at their total. It is part of the Decision published.
type RoleDecision struct {
	// CurrentPrefill and CurrentDecode are the live workers; Prefill and
	// Decode the split after the move (equal to the current one when
	// nothing moves).
	CurrentPrefill int `json:"current_prefill"`
	CurrentDecode  int `json:"current_decode"`
	Prefill        int `json:"prefill"`
	Decode         int `json:"decode"`
	// Moved workers go From → To ("prefill", "decode"); 0 when none.
	Moved int    `json:"moved"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	// Changed: workers move.
	Changed bool   `json:"changed"`
	Reason  string `json:"reason"`
	// PredictedBefore and PredictedAfter are the predicted attainments of
	// the current split and of the best split at the planned rate;
	// PredictedGain their difference.
	PredictedBefore float64 `json:"predicted_attainment_before"`
	PredictedAfter  float64 `json:"predicted_attainment_after"`
	PredictedGain   float64 `json:"predicted_gain"`
	// Measured is the attainment measured over the window now (the
	// fraction of observed requests within both SLOs; -1 without TTFT
	// measurements).
	Measured float64 `json:"measured_attainment"`
	// Effect, set once per move one window after it, is the attainment
	// measured over the window before the move and over the window since.
	Effect *RoleEffect `json:"effect,omitempty"`
}

// RoleEffect is the measured effect of a role move.
type RoleEffect struct {
	Moved          time.Time `json:"moved"`
	From           string    `json:"from"`
	To             string    `json:"to"`
	N              int       `json:"n"`
	BeforeMeasured float64   `json:"measured_attainment_before"`
	AfterMeasured  float64   `json:"measured_attainment_after"`
	Predicted      float64   `json:"predicted_gain"`
}

// Reasons of a RoleDecision.
const (
	RoleReasonMove      = "move"
	RoleReasonBest      = "best split"  // the current split is the best one
	RoleReasonDwell     = "dwell"       // the last move is too recent
	RoleReasonSmallGain = "small gain"  // below MinGain
	RoleReasonTooFew    = "too few"     // fewer than two workers: nothing can move
	RoleReasonUneven    = "uneven GPUs" // the two roles' workers differ in GPUs
)

func (r *RoleOptions) defaults() error {
	if r.MinDwell == 0 {
		r.MinDwell = 2 * time.Minute
	}
	if r.MinGain == 0 {
		r.MinGain = 0.02
	}
	if r.MinDwell < 0 || !(r.MinGain > 0 && r.MinGain <= 1) {
		return fmt.Errorf("%w: role min dwell must be ≥ 0 and min gain in (0, 1]", ErrConfig)
	}
	return nil
}

// measuredAttainment is the fraction of obs within both SLOs, a refused
// request a miss, a served retry of one (TermsOnly) not counted; -1 when
// none has a TTFT or was refused.
func measuredAttainment(obs []Observation, slo SLO) float64 {
	n, met := 0, 0
	for _, ob := range obs {
		if ob.TermsOnly {
			continue
		}
		if ob.Refused {
			n++ // a miss
			continue
		}
		if ob.TTFT <= 0 {
			continue
		}
		n++
		if ob.TTFT <= slo.TTFT && (ob.OutputTokens < 2 || ob.TPOT <= slo.TPOT) {
			met++
		}
	}
	if n == 0 {
		return -1
	}
	return float64(met) / float64(n)
}

// planRoles returns the best split of the curP+curD live workers at rate
// and whether to move to it: never a role's last worker, at most one
// move per MinDwell, and only for a predicted gain of MinGain or more.
func (s *searcher) planRoles(ro RoleOptions, curP, curD int, rate float64, now, lastMove time.Time) RoleDecision {
	rd := RoleDecision{CurrentPrefill: curP, CurrentDecode: curD, Prefill: curP, Decode: curD}
	n := curP + curD
	switch {
	case curP < 1 || curD < 1 || n < 2:
		rd.Reason = RoleReasonTooFew
		return rd
	case s.cfg.Prefill.Units() != s.cfg.decodeProfile().Units():
		rd.Reason = RoleReasonUneven
		return rd
	}
	cur := Design{Prefill: curP, Decode: curD}
	rd.PredictedBefore = s.sim.run(cur, rate, false).Attainment
	best, bestA := cur, rd.PredictedBefore
	for p := 1; p < n; p++ {
		d := Design{Prefill: p, Decode: n - p}
		if d == cur {
			continue
		}
		// Ties keep the current split, then the split nearest to it.
		if a := s.sim.run(d, rate, false).Attainment; a > bestA || (a == bestA && best != cur && abs(p-curP) < abs(best.Prefill-curP)) {
			best, bestA = d, a
		}
	}
	rd.PredictedAfter, rd.PredictedGain = bestA, bestA-rd.PredictedBefore
	switch {
	case best == cur:
		rd.Reason = RoleReasonBest
	case rd.PredictedGain < ro.MinGain:
		rd.Reason = RoleReasonSmallGain
	case !lastMove.IsZero() && now.Sub(lastMove) < ro.MinDwell:
		rd.Reason = RoleReasonDwell
	default:
		rd.Prefill, rd.Decode, rd.Changed, rd.Reason = best.Prefill, best.Decode, true, RoleReasonMove
		rd.From, rd.To, rd.Moved = "decode", "prefill", best.Prefill-curP
		if rd.Moved < 0 {
			rd.From, rd.To, rd.Moved = "prefill", "decode", -rd.Moved
		}
	}
	return rd
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
