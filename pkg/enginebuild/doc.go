// Package enginebuild builds the engine that enginecfg.Options select:
// the reference CPU engine (--engine ref), the performance-model engine
// (--engine sim) or llama.cpp (--engine llamacpp). The workers and the
// profiler build engines; the coordinator only reads the settings
// (package enginecfg: flags, validation, the model's tokenizer), so it
// does not link the engines it never runs.
//
// Once SetLogger was called, a sim engine built afterwards warns
// (rate-limited) when a step takes longer than the modeled GPU would: its
// times are then the machine's, not the profile's.
package enginebuild
