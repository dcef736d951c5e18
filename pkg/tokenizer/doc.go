// Package tokenizer holds the byte-level tokenizer used with the synthetic
// model presets: one token per byte (ids 0–255) plus BOS and EOS.
package tokenizer
