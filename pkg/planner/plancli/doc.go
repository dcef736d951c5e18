// Package plancli is the `coordinator plan` subcommand: flags → a
// planner.Config per profile → planner.Run → a table or JSON on stdout
// and, on request, a PNG of goodput per GPU against the P:D ratio.
//
// --profile takes an embedded name or a profile .json file, such as one
// `coordinator profile` measured. With CPU profiles the budget
// (--gpu-budget, by default the cores of the machine the profile was
// measured on) and the price (--gpu-cost-per-hour, per core-hour) count cores, each
// worker taking its profile's threads; --colocated-profile gives the
// colocated workers another profile (another thread count), so that a
// plan on two cores weighs 1P+1D at one thread each against one colocated
// worker at two.
//
// Codec ratios and speeds come from a codec profile (--codec-profile):
// the built-in one by default, a file that `coordinator codecs --out`
// (Codecs, the same self-benchmark the prefill workers run) wrote on the
// target hardware, or "self" to measure this machine. Warnings that the
// workload leaves a profile's measured range go to stderr as well as into
// the report.
//
// The coordinator wires Run and Codecs as subcommands: Run has the
// signature of coordinator.Subcommand.Run, Codecs takes the host's
// description besides. Nothing here reads the clock
// except to report how long planning took (on stderr) and the codec
// benchmark.
package plancli
