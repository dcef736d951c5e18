// Package apikey authenticates the clients of the OpenAI API: it reads a
// file of API key hashes with optional names and per-key rate limits,
// checks a presented bearer key against it in constant time, keeps each
// key's requests-per-minute and tokens-per-minute buckets, reloads the
// file without a restart, and guards /metrics with a token of its own.
//
// # The key file
//
// One key per line; blank lines are ignored and "#" starts a comment that
// runs to the end of the line:
//
//	# team-a: 600 requests and 200k tokens a minute
//	sha256:b45b2e4b1bbb2dab63551642d4f17c7c6aefad7f9acf3c30aa47a40ffc39c922 name=team-a rpm=600 tpm=200000
//	sha256:15489f8bde4be0669d80ea18f6c5a02e3682a92c942d3e4e1b2c64ce13482a1c   # no name, no limits
//
// The first field is "sha256:" and the 64 hex digits of the SHA-256 of the
// key (either case), never the key itself: a line whose first field is
// anything else, such as a plaintext key, makes the whole file invalid
// (ErrPlaintext), and the error names the line but never its text. `coordinator
// hash-key` (FormatLine) prints the line of a key read on stdin. The
// other fields, each at most once, in any order:
//
//   - name=NAME: 1 to 64 of A-Z a-z 0-9 . _ - @; it is the key's name in
//     logs and error messages and its surface for prompt budgets (the
//     policy's prompt_budgets.api_keys are key names when keys are
//     configured). Several keys may share a name (a rotation); their limits
//     stay apart. Without a name a key is "sha256:" and the first 8 hex
//     digits of its hash.
//   - tenant=NAME: 1 to 64 of the same characters: the key's prefix-cache
//     partition (Key.Tenant), shared with every key naming the same
//     tenant. Without it each key is a partition of its own: a cached
//     prefix, and the prefix_hit_tokens a response reports, are never
//     shared between keys unless the file says so.
//   - rpm=N: at most N requests a minute, 1 ≤ N ≤ MaxLimit.
//   - tpm=N: at most N tokens a minute, 1 ≤ N ≤ MaxLimit (the frontend
//     counts a request's prompt tokens plus n × max_tokens at admission and
//     returns what it did not generate at the end; a grammar adds n ×
//     grammar.CostTokens, kept).
//
// A key may appear only once. A file without keys (empty, or only
// comments) is valid and refuses every request: emptying the file revokes
// every key, without a restart; to leave the API open, run without a key
// file. A reload on change applies a file without keys once a read
// EmptyGrace (1 s) or more after the first that found it so still does (a
// file caught between its truncation and its new content is empty too),
// so revocation takes up to a reload interval more than that; a forced
// reload (SIGHUP) applies it at once. Errors wrap ErrPlaintext
// or ErrInvalid.
//
// # Rate limits
//
// Each limit is a token bucket holding up to its per-minute limit and
// refilled continuously at limit per minute, full at first use: a burst
// of the whole limit, then the steady rate. Remaining is what the bucket
// holds (whole units), Reset the time until it is full again, as OpenAI's
// x-ratelimit-remaining-* and x-ratelimit-reset-* report them. Arithmetic
// is exact (integers), so the same clock gives the same answers. Time is
// an input: every method that needs it takes now, and a clock that goes
// back is treated as standing still. A key kept across a reload (same
// hash) keeps its buckets; a changed limit applies to the bucket as it
// is, capped at the new limit.
//
// Tokens are charged by one rule on every path a request takes (served
// here, forwarded to another region for its budget, or forwarded because
// this region cannot serve it): reserve before it runs, settle to what it
// used when it ends (Key.SettleTokens). The reservation is a take, so a
// bucket that cannot cover it refuses the request with a RetryAfter; it
// is the most the request may use when that can be counted (its prompt
// plus n × max_tokens), else the one token every request uses at least.
// Settling gives back what was reserved and not used, or takes what was
// used beyond the reservation after the fact, never refused, into debt:
// the level falls below zero (down to one limit below, a little less
// for limits above 76 million, where the level would not fit an int64),
// Remaining reads 0, and every take waits until the refill has paid the
// debt back. Debt rather than a floor at empty: with a floor, a request
// whose tokens could only be counted after it ran used what it liked for
// free once the bucket was empty, and a key's limit would depend on
// where its requests were served.
//
// # Reloading
//
// Keys.Reload rereads the file; ReloadIfChanged does when its modification
// time or size changed and its content (SHA-256) differs from what was
// last read. A reload that fails (a missing, unreadable or invalid file)
// keeps the keys that were loaded and returns the error: a file deleted
// by mistake (or replaced non-atomically) does not lock every client out;
// revoke every key by emptying the file instead. The failed content is
// not tried again until it changes or a forced Reload, and a missing file
// is reported once until it is back. A reload is atomic:
// a request authenticates against the old set or the new one, and a key
// removed from the file fails from the reload on. Watch runs both on a
// ticker and a signal channel (SIGHUP in the coordinator), logs the
// outcome and counts each failure (the coordinator's
// pdserve_auth_reload_errors_total). Token does the same for the /metrics token file.
//
// # Secrets
//
// Neither the keys nor anything derived from them beyond the first 8 hex
// digits of their SHA-256 (Key.Prefix, HashPrefix) is kept or logged. A
// presented key is hashed and its digest compared with every entry's by
// crypto/subtle, without stopping at a match.
//
// Keys, Key and Token are safe for concurrent use.
package apikey
