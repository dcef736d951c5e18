// Package batch is the decode worker's batch: continuous batching over
// one engine (ollama's runner; etcd raft's Ready/Advance). Requests join
// at step boundaries while the batch has room, in order of readiness but
// for interactive ones going ahead of older batch ones, at most
// Config.Overtakes times in a row (pkg/batching's Order), remote KV
// imported then
// and local prompts prefilled in chunks beside the decodes (Sarathi);
// every running sequence decodes one token a step; a finished request's
// prompt goes into the prefix cache.
//
// A Batch owns every per-sequence field and the engine's memory and is
// touched only by its loop goroutine (Run), without a lock. The worker's
// service and KV receiver reach it only by messages posted to its mailbox
// (Join, Arrived, Cancel, Reclaimed, Export), which the loop takes at each step
// boundary; results go back through each request's Outbox and the
// Config.Report of the requests that ended. A request handed over by Join
// is ended by the batch alone, which reports it exactly once.
//
// A running request moves to another batch (a live migration) by Export,
// which snapshots its KV (prompt and output but the last token) and its
// output tokens and ends it as Migrated, and a Join on the other batch
// with Generated set to those tokens and KV to the snapshot's: the
// target computes nothing again and samples the next token at the same
// position, with penalties counted over the same tokens.
//
// It imports engine, prefixcache, grammar (through the engine's grammar
// states), kv and runner, never grpc or the api: errors come back as
// kinds (End.Kind), which the service maps to status codes.
package batch
