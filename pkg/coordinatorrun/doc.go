// Package coordinatorrun is the coordinator binary (cmd/coordinator) as
// an importable runner: Main dispatches a subcommand (Subcommands:
// profiles, calibrate, plan, profile, hash-key) or serves: it parses the flags of
// coordinator.Options and plannerhost.Options, completes and validates
// them (exit 2 on any error), logs the effective configuration, adds the
// online planner as a coordinator extension, and runs the coordinator
// until its context ends (exit 0) or it fails (exit 1). With an API key
// or metrics token file it catches SIGHUP to reload them.
package coordinatorrun
