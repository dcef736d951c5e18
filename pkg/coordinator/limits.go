package coordinator

import (
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/frontend"
)

// maxChoices returns the most choices (n) a request may ask: the largest
// batch a live decode or colocated worker reports in its heartbeats
// (frontend.Options.MaxChoices), 0 while none reports one. The largest,
// not the smallest: a worker advertising a small batch must not lower
// the limit for every request; the workers still refuse what they
// cannot take.
func (c *Coordinator) maxChoices() int {
	n := 0
	for _, hb := range c.members.All() {
		if (hb.Role == string(control.RoleDecode) || hb.Role == string(control.RoleColocated)) && !hb.Draining {
			n = max(n, hb.MaxBatch)
		}
	}
	return n
}

// checkSizes reports a request whose sizes do not fit the workers' RPCs
// (int32 token counts), as a 400 on max_tokens: the frontend bounds them
// already (frontend.MaxSequenceTokens), so this only guards the
// conversions against a change there.
func checkSizes(req *frontend.Request) error {
	if p, m := len(req.Prompt), req.MaxTokens; p < 0 || m < 0 || req.N < 0 || p > frontend.MaxSequenceTokens-m || req.N > frontend.MaxSequenceTokens {
		return frontend.NewError(frontend.ErrInvalid, "context_length_exceeded", "max_tokens",
			"The prompt's %d tokens and max_tokens %d are over the %d tokens a sequence may have.", p, m, frontend.MaxSequenceTokens)
	}
	return nil
}
