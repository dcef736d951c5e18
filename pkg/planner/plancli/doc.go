// Package plancli is the `coordinator plan` subcommand: flags → a
// planner.Config per profile → planner.Run → a table or JSON on stdout
// and, on request, a PNG of goodput per GPU against the P:D ratio.
//
// The coordinator wires it as one more subcommand: Run has the signature
// of coordinator.Subcommand.Run. Nothing here reads the clock except to
// report how long planning took (on stderr).
package plancli
