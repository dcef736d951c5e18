// Package enginecfg builds the engine a worker runs from its flags: the
// reference CPU engine (--engine ref, --preset, --seed) or the
// performance-model engine (--engine sim, --profile, --time-scale).
// Workers of one deployment must be built from the same settings, so that a
// prefill worker's KV and sampling match its decode workers'.
package enginecfg
