package control

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Role is what a worker does.
type Role string

// Worker roles.
const (
	RolePrefill   Role = "prefill"
	RoleDecode    Role = "decode"
	RoleColocated Role = "colocated" // a decode worker that prefills too
)

// Heartbeat is a worker's state, published every interval.
type Heartbeat struct {
	ID       string `json:"id"`        // worker id, a subject token
	Role     string `json:"role"`      // a Role
	GRPCAddr string `json:"grpc_addr"` // host:port serving the worker's gRPC services
	Model    string `json:"model"`     // model name
	// MaxSeqLen is the model's longest sequence (prompt + output) in
	// tokens, engine.ModelSpec.MaxSeqLen; 0 when the worker does not say
	// (an older worker).
	MaxSeqLen int `json:"max_seq_len"`
	// MaxBatch is the most sequences one step of a decode or colocated
	// worker runs: the most choices (n) a request of it may ask; 0 when
	// the worker does not say.
	MaxBatch int `json:"max_batch,omitempty"`

	KVBlocksFree        int       `json:"kv_blocks_free"`        // free KV blocks (decode, colocated)
	KVBlocksTotal       int       `json:"kv_blocks_total"`       // KV blocks in the pool
	QueuedPrefillTokens int       `json:"queued_prefill_tokens"` // prompt tokens waiting for prefill
	RunningBatch        int       `json:"running_batch"`         // sequences in the running batch
	StepTimesMs         []float64 `json:"step_times_ms"`         // recent step times, milliseconds, oldest first
	PrefixDigest        []uint64  `json:"prefix_digest"`         // hashes of cached prefix blocks (kv.HashBlocks), at most 4096; empty from a worker that publishes KV events
	Draining            bool      `json:"draining"`              // takes no new requests
	Elastic             bool      `json:"elastic,omitempty"`     // takes role commands (CmdRole)
	Time                time.Time `json:"time"`                  // when the worker took it, worker clock

	// CodecSpeeds are the worker's KV codec speeds from its self-benchmark
	// (pkg/kv/codec SelfBench on its KV dtype, at start): decode and
	// colocated workers publish them so that a prefill worker can predict
	// how fast the receiver of a transfer decodes each codec. Empty until
	// the benchmark finished, and from workers that run none.
	CodecSpeeds []CodecSpeed `json:"codec_speeds,omitempty"`
	// CodecCores is how many transfers the worker decodes at once at full
	// per-core speed (its GOMAXPROCS); 0 when it does not say.
	CodecCores int `json:"codec_cores,omitempty"`

	// BlockTokens is the worker's block size in tokens: of its KV pool
	// (decode, colocated) and of its prefix hashes (PrefixDigest), which
	// the coordinator's must equal; 0 when the worker does not say (an
	// older worker).
	BlockTokens int `json:"block_tokens,omitempty"`
	// Codecs are the KV codecs (pkg/kv/codec names) the worker can use on
	// its KV's element type: encode (prefill) or decode (decode,
	// colocated); empty when it does not say.
	Codecs []string `json:"codecs,omitempty"`
	// PeerPullCost is the time the worker takes to pull one token of a
	// cached prefix's KV from a peer worker over the time it takes to
	// compute it: its link model (the throughput its pulls achieved, or
	// the link it assumes, --peer-link-gbps) against its measured prefill
	// throughput. The router credits the worker with prefixes its peers
	// hold at that cost. 0 (or absent): it does not pull (pulls off, an
	// older worker, or no prefill step measured yet).
	PeerPullCost float64 `json:"peer_pull_cost,omitempty"`
	// HashKeyID names the key of the worker's block hashes
	// (kv.HashKey.ID, not the key): the coordinator refuses a worker
	// whose differs from its own, as its cached prefixes would never
	// match. Empty: public hashes.
	HashKeyID string `json:"hash_key_id,omitempty"`
	// BootEpoch is random at the worker's start (16 hex digits): the
	// coordinator binds the credentials it signs for the worker to it,
	// so that one used before a restart is refused after it. Empty from a
	// worker without a verify key.
	BootEpoch string `json:"boot_epoch,omitempty"`
}

// CodecSpeed is one codec's figures in a heartbeat.
type CodecSpeed struct {
	Codec string `json:"codec"` // pkg/kv/codec name
	// EncodeBytesPerSec and DecodeBytesPerSec are raw KV bytes per second
	// one core codes; > 0.
	EncodeBytesPerSec float64 `json:"encode_bytes_per_s"`
	DecodeBytesPerSec float64 `json:"decode_bytes_per_s"`
	// Ratio is raw bytes over encoded bytes on the benchmark's sample.
	Ratio float64 `json:"ratio"`
}

// Validate reports ErrBadHeartbeat, wrapped, when hb cannot be published or
// observed: an id or role that is not a subject token.
func (hb Heartbeat) Validate() error {
	if err := ValidToken(hb.ID); err != nil {
		return fmt.Errorf("%w: id: %w", ErrBadHeartbeat, err)
	}
	if err := ValidToken(hb.Role); err != nil {
		return fmt.Errorf("%w: role: %w", ErrBadHeartbeat, err)
	}
	return nil
}

// Subject prefixes and subjects.
const (
	heartbeatPrefix = "pdserve.hb."
	commandPrefix   = "pdserve.cmd."
	// HeartbeatWildcard matches every heartbeat subject.
	HeartbeatWildcard = heartbeatPrefix + ">"
	// PlanSubject carries planner decisions.
	PlanSubject = "pdserve.plan"
	// RegionPrefix starts the subjects of the regions' federation
	// (package region): coordinators' summaries and their round-trip
	// probes, which cross the NATS gateways between regions. Only
	// coordinators publish and subscribe to them.
	RegionPrefix = "pdserve.region."
	// RegionWildcard matches every region subject.
	RegionWildcard = RegionPrefix + ">"
)

// HeartbeatSubject returns "pdserve.hb.<role>.<id>".
func HeartbeatSubject(role, id string) string { return heartbeatPrefix + role + "." + id }

// CommandSubject returns "pdserve.cmd.<role>.<id>".
func CommandSubject(role, id string) string { return commandPrefix + role + "." + id }

// ValidToken reports ErrBadToken, wrapped, when s cannot be one token of a
// NATS subject: empty, or containing '.', '*', '>' or white space.
func ValidToken(s string) error {
	if s == "" || strings.ContainsAny(s, ".*> \t\r\n") {
		return fmt.Errorf("%w: %q", ErrBadToken, s)
	}
	return nil
}

// Errors returned by this package, wrapped with detail; match with
// errors.Is.
var (
	// ErrBadToken: an id or role that is not a NATS subject token.
	ErrBadToken = errors.New("control: not a subject token")
	// ErrBadHeartbeat: a heartbeat that cannot be published or observed.
	ErrBadHeartbeat = errors.New("control: invalid heartbeat")
	// ErrBadCommand: a command without a kind, or a reply that is not JSON.
	ErrBadCommand = errors.New("control: invalid command")
	// ErrCommandFailed: the worker received the command and its handler
	// returned an error (its text is in the wrapping error).
	ErrCommandFailed = errors.New("control: command failed")
	// ErrRefused: a heartbeat whose limits contradict the observer's
	// configuration (Membership's WithCheck).
	ErrRefused = errors.New("control: heartbeat refused")
	// ErrNoWorker: nobody listens on the worker's command subject.
	ErrNoWorker = errors.New("control: no such worker")
)
