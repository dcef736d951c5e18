package decode

import (
	"context"

	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// ExportPrefix implements kvtransfer.PullSource (with BlockTokens): a
// peer worker's pull of a prefix this worker's prefix cache holds in any
// tier (prefixcache.Export, the engine lock taken a layer at a time).
func (s *Server) ExportPrefix(_ context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	lock := func() func() {
		s.run.LockEngine()
		return s.run.UnlockEngine
	}
	x, err := s.cache.Export(s.eng, lock, hashes, minBlocks, maxBlocks)
	return kvtransfer.PrefixKV{Tokens: x.Tokens, Tier: x.Tier, Layers: x.Layers}, err
}
