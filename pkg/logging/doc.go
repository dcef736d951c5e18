// Package logging builds the logger every pdserve binary writes with: JSON
// lines on stderr at a chosen level (debug, info, warn, error), ISO 8601
// times, durations as strings, and no sampling, so that request lines and
// refusals are all kept under load. The coordinator and the workers share
// it; it depends on zap only.
package logging
