// Package layering holds no code: its test asserts the import layers of
// pdserve's packages with the go tool (go list), so that an import running
// back up the layers fails the build's tests instead of going unnoticed. A
// rule counts what a package links (go list -deps: its imports, theirs, and
// so on), not only what it imports, and covers the packages under it too
// (pkg/coordinator's covers pkg/coordinator/flow).
//
// The rules (TestLayering): the coordinator stands beside the workers, not
// above them — pkg/coordinator links no worker package (prefill, decode,
// workerrun, enginebuild), neither the KV transfer (kvtransfer) nor the sim
// engine; coordinatorrun imports no worker package itself (standalone mode
// does, in package standalone); the workers link no coordinator package;
// the frontend links no engine implementation; the tokenizer and the
// sampling types link no engine at all; the request flow's core
// (pkg/coordinator/flow) links neither the frontend, the protobuf API
// (api/...), the wire helpers nor gRPC: its shell converts at the edge.
package layering
