// Package enginetest is the conformance suite of the engine.Engine
// contract. Every engine implementation runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		enginetest.Run(t, func(t *testing.T) engine.Engine {
//			e := mustNew(t)
//			t.Cleanup(e.Close)
//			return e
//		})
//	}
//
// The suite checks behaviour — token ids, lengths, KV delivery and sizes,
// errors — and, where the engine computes logits, compares the logits of
// one sequence computed in two ways (after a Fork and from a fresh
// prefill; as an AllLogits row and as the last position of a shorter
// prefill) within LogitTolerance, bit for bit by default. It fits engines
// that compute no logits (the performance-model engine), for which those
// comparisons reduce to tokens, as well as the reference transformer. Its
// optional cases (Fork, AllLogits, Penalties) skip engines without the
// feature. Exact numerical equivalences of the reference engine live in
// its own tests.
package enginetest
