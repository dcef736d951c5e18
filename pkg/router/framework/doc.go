// Package framework holds the types and interfaces of the router's
// plugins: the Candidate a plugin sees, the Input of a routing cycle, and
// the Filter, Scorer and Picker interfaces. Package router re-exports them
// (router.Scorer is framework.Scorer) and runs them; the plugins under
// pkg/router/plugins implement them.
//
// The plugins import this package, not package router, so that router can
// build its default profiles from them without an import cycle (the shape
// of gateway-api-inference-extension's scheduling framework).
//
// Plugins are pure: they read their inputs, never a clock, and do no I/O.
// The framework times every call; a plugin does not time itself.
package framework
