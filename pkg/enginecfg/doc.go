// Package enginecfg holds the settings of the engine a worker runs, from
// its flags: the reference CPU engine (--engine ref, --preset, --seed),
// the performance-model engine (--engine sim, --profile, --time-scale) or
// llama.cpp (--engine llamacpp, --model, …); it validates them, logs them,
// and opens the model's tokenizer alone (Tokenizer) for the coordinator.
// Package enginebuild builds the engine. Workers of one deployment must be
// built from the same settings, so that a prefill worker's KV and
// sampling match its decode workers'.
//
// The sim engine hands out DefaultPayloadScale of the true KV bytes unless
// --payload-scale says otherwise.
package enginecfg
