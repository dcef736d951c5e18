package coordinator

import (
	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
)

// peerRoles are the roles whose workers' caches a prefill worker may pull
// a prefix from: any worker that keeps prompts.
var peerRoles = []control.Role{control.RolePrefill, control.RoleDecode, control.RoleColocated}

// depth returns how many leading blocks of hashes worker id holds in any
// tier of its prefix cache, by the index of its KV events (0 without
// any).
func (b *backend) depth(id string, hashes []uint64) int {
	n := 0
	for _, v := range []*control.WorkerBlocks{b.kv.Blocks(id), b.kv.HostBlocks(id), b.kv.DiskBlocks(id)} {
		if v != nil {
			n = max(n, v.Match(hashes))
		}
	}
	return n
}

// peerPrefix returns the worker that holds the longest prefix of a
// prompt's blocks (hashes) in any tier of its cache, when it holds more
// of it than worker (the chosen prefill worker) does, for the Prefill
// request's peer: the prefill worker then pulls the prefix if its link
// model says the pull beats computing it. Nil without KV events, or when
// no live, non-draining worker of a role that keeps prompts holds more.
func (b *backend) peerPrefix(worker string, hashes []uint64) *pdservev1.PeerPrefix {
	if b.kv == nil || len(hashes) == 0 || b.prefixBlockTokens <= 0 {
		return nil
	}
	own := b.depth(worker, hashes)
	var best *control.Heartbeat
	bestN := own
	for _, role := range peerRoles {
		for _, hb := range b.members.Members(role) {
			if hb.ID == worker || hb.GRPCAddr == "" {
				continue
			}
			if n := b.depth(hb.ID, hashes); n > bestN {
				best, bestN = &hb, n
			}
		}
	}
	if best == nil {
		return nil
	}
	return &pdservev1.PeerPrefix{
		Addr: best.GRPCAddr, Id: best.ID, Role: best.Role, Tokens: int32(bestN * b.prefixBlockTokens),
		// One pull from this peer, in its present start, by this
		// worker, of exactly this prompt's chain: the puller holds no
		// key, and the credential reads nothing else.
		Credential: b.auth.PullCredential(best.ID, best.BootEpoch, worker, hashes),
	}
}
