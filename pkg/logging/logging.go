package logging

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a JSON production logger at level (debug, info, warn,
// error) writing to stderr. Errors: an unknown level, or zap's.
func New(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("logging: log level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	// No sampling: zap's production config keeps 100 entries a second per
	// message and then 1 in 100, which drops request lines and refusals
	// ("request refused") under load, when they matter most.
	cfg.Sampling = nil
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "time"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.EncoderConfig.EncodeDuration = zapcore.StringDurationEncoder
	l, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("logging: logger: %w", err)
	}
	return l, nil
}
