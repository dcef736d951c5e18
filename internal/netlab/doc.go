// Package netlab builds a small multi-host network on one Linux machine:
// network namespaces joined by veth pairs whose both ends live in
// namespaces the Lab created, links shaped with tc (netem for delay and
// loss, tbf for rate), and processes started inside a namespace. It is the
// harness of cmd/netbench and cmd/chaos.
//
// # Safety
//
// A Lab only ever touches what it made: namespaces named
// "pdl-<pid>-<run>-<name>" (unique per run, so concurrent runs do not
// collide), veths created directly inside them (never in the caller's
// namespace), and addresses from 198.18.0.0/15 (RFC 2544 benchmarking
// space) assigned inside them. Nothing outside is ever a target: a process
// in a namespace sees only its own loopback and the veths of the Lab.
//
// # Teardown
//
// Close kills every process the Lab started (SIGKILL to its process group)
// and deletes every namespace, which destroys the veths in it; it is
// idempotent and safe to call from a deferred function, so a panic or a
// cancelled context (signal.NotifyContext) still tears down. A run killed
// with SIGKILL cannot clean up after itself: Sweep deletes the namespaces
// of Labs whose process is gone, and New calls it.
//
// # Privileges
//
// Creating namespaces needs CAP_SYS_ADMIN (root). New returns an error
// wrapping ErrUnsupported when the machine does not allow it (not root,
// EPERM, no ip or tc binary); tests skip on it with a message, except
// under CI=true as root, where the harness must work (see SkipUnsupported).
package netlab
