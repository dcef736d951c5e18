package workerrun

import (
	"context"
	"fmt"
)

// MigrateAll drains a decode (or colocated) worker by moving its running
// sequences, KV included, to other decode workers instead of waiting for
// the longest one: Drain, then decode.Server.MigrateAll. It returns how
// many of those running moved; those still waiting for their KV or
// prefilling move once they have a token, those of several choices
// finish here, and WaitIdle-style shutdown waits for them and for the
// moved KV's pulls. The coordinator resumes each moved request on another decode
// worker, so call it only when one can take them. A prefill worker has
// nothing to move (an error).
func (w *Worker) MigrateAll(ctx context.Context) (int, error) {
	rr := w.cur()
	d, ok := rr.svc.(decodeService)
	if !ok {
		return 0, fmt.Errorf("workerrun: worker %s (%s) runs no decode sequences to migrate", w.id, rr.role)
	}
	w.Drain()
	return d.MigrateAll(ctx)
}
