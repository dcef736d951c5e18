// Package respstore keeps the stored responses of the Responses API
// (POST /v1/responses with store true) in a NATS JetStream key-value
// bucket, so that every coordinator replica on the same NATS can read,
// delete and continue (previous_response_id) a response any of them
// made.
//
// A response belongs to its owner, the SHA-256 of the API key that made
// it: its key in the bucket is "<owner>.<response id>", so a Get with
// another owner finds nothing (ErrNotFound), never the content. Each
// owner has an index entry ("<owner>.index": the ids, sizes and times
// of its responses) updated by compare-and-set, which bounds an owner to
// Limits.MaxPerOwner responses and Limits.MaxBytesPerOwner bytes: a Put
// over either evicts the owner's oldest responses first. The bucket's
// TTL (Limits.TTL, the stream's max age) drops every response after it,
// and its MaxBytes bounds the bucket as a whole (the stream drops its
// oldest messages beyond it). A response NATS no longer has (expired,
// evicted, a NATS server that lost its store) is ErrNotFound: the
// frontend answers 404 for it and never continues another conversation.
//
// Values are JSON Records; one is at most Limits.MaxValueBytes (the
// bucket's max value size): a larger one is refused with ErrTooLarge.
package respstore
