package decode

import "context"

// Run runs the batch (pkg/decode/batch: continuous batching) until ctx
// ends or Stop is called, then ends every request with UNAVAILABLE and
// frees its engine sequence and blocks. It returns nil after a stop, or
// an error when Run was called twice.
func (s *Server) Run(ctx context.Context) error { return s.b.Run(ctx) }

// Stop ends Run; it does not wait.
func (s *Server) Stop() { s.stop() }
