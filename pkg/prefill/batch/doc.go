// Package batch is the prefill worker's batch: chunked prefill by
// priority over one engine (ollama's runner; etcd raft's Ready/Advance).
// Requests start when the engine's memory holds them, in arrival order,
// except that a waiting interactive request goes ahead of older batch
// ones, at most Config.Overtakes times in a row, which bounds a batch
// request's wait (pkg/batching's Order). Every step gives each
// started request at most Config.ChunkTokens of its remaining prompt
// until Config.MaxBatchTokens are used; a prompt whose last chunk ran
// yields its first token and its engine sequence becomes a prefix cache
// entry.
//
// A Batch owns every per-request field of the prefill (engine sequence,
// progress, prefix hits, grammar state), the prefix cache's engine
// sequences and the engine's memory, and is touched only by its loop
// goroutine (Run), without a lock. The worker's service reaches it only
// by messages posted to its mailbox (Join, Cancel, Purge), which the loop
// takes at each step boundary; what the batch produces goes back through
// each request's Outbox (the KV as it is computed, the end). A request
// handed over by Join is ended by the batch exactly once (Outbox.End),
// unless a Cancel took it out first.
//
// It imports engine, prefixcache, kv and runner, never grpc or the api:
// errors come back as kinds (End.Kind), which the service maps to status
// codes, and the first token's logits, which the service turns into a
// log-probability.
package batch
