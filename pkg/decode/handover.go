package decode

import (
	"github.com/pdserve/pdserve/pkg/decode/batch"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// HandOverPrefixCache asks the batch to hand its prefix cache's engine
// tier to to when it stops (Stop), instead of freeing it: an elastic
// worker's next role on the same engine adopts it (AdoptPrefixCache, or
// the prefill server's). to must have room for the one Handover; nothing
// is sent when the batch never ran. Safe from any goroutine.
func (s *Server) HandOverPrefixCache(to chan<- prefixcache.Handover) { s.b.Post(batch.HandOver(to)) }

// AdoptPrefixCache gives the batch h, the prefix cache of the worker's
// previous role on the same engine, which it takes in at its first step
// boundary (batch.Adopt; the pool charge of what it keeps follows):
// call it before Run, before any request. The Server owns h's engine
// sequences from then on.
func (s *Server) AdoptPrefixCache(h prefixcache.Handover) { s.b.Post(batch.Adopt(h)) }
