// Package sampling holds the sampling settings of a request and the
// log-probabilities of its tokens, as the API's layers (the frontend, the
// wire conversions) and the engines share them: Sampling (temperature,
// top-p, seed, penalties, a decoding constraint), Penalties, Constraint,
// TokenLogprob and TokenProb. It holds types only, and imports nothing of
// pdserve; package engine names them (type aliases) and samples with them.
package sampling
