// Package maxscore is the router's picker: the highest weighted sum wins.
//
// Contract: Pick returns the index of the candidate with the largest
// total; among equal totals, the lowest Worker.ID (byte order), then the
// earliest index. It is deterministic and does not depend on the order
// of candidates with distinct ids.
package maxscore

import "github.com/pdserve/pdserve/pkg/router/framework"

// Picker picks the highest total. The zero value is ready; safe for
// concurrent use.
type Picker struct{}

var _ framework.Picker = (*Picker)(nil)

// Name implements framework.Plugin.
func (*Picker) Name() string { return "maxscore" }

// Pick implements framework.Picker.
func (*Picker) Pick(_ *framework.Input, cs []framework.Candidate, totals []float64) int {
	best := 0
	for i := 1; i < len(cs); i++ {
		if totals[i] > totals[best] || totals[i] == totals[best] && cs[i].Worker.ID < cs[best].Worker.ID {
			best = i
		}
	}
	return best
}
