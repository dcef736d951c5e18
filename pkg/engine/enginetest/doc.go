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
// The suite checks behaviour only — token ids, lengths, KV delivery and
// sizes, errors — never logit values, so it fits engines that compute no
// logits (the performance-model engine) as well as the reference
// transformer. Exact numerical equivalences of the reference engine live in
// its own tests.
package enginetest
