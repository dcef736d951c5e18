// Package enginecfg builds the engine a worker runs from its flags: the
// reference CPU engine (--engine ref, --preset, --seed) or the
// performance-model engine (--engine sim, --profile, --time-scale).
// Workers of one deployment must be built from the same settings, so that a
// prefill worker's KV and sampling match its decode workers'.
//
// The sim engine hands out DefaultPayloadScale of the true KV bytes unless
// --payload-scale says otherwise, and, once SetLogger was called, warns
// (rate-limited) when a step takes longer than the modeled GPU would: its
// times are then the machine's, not the profile's.
package enginecfg
