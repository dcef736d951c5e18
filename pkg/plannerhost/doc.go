// Package plannerhost runs package planner's Online inside a coordinator:
// Options (--planner and --planner-*, --link-gbps, --gpu-budget; the
// GPU price is the policy's pricing.gpu_usd_per_hour, the one that prices
// requests) and Host, a coordinator.Extension. The coordinator hands
// Host the budget trace of every request it completed; a re-plan every
// interval publishes a planner.Decision on control.PlanSubject and sets
// pdserve_pool_replicas{role,kind="desired|current"} (current: live
// workers), and the actuator logs the change (log) or scales the
// Deployments (kubernetes, package planner/actuator). With --planner-roles
// it also moves elastic workers (their heartbeats say elastic) between
// prefill and decode (planner.RoleOptions: --planner-role-dwell,
// --planner-role-min-gain), sending control.CmdRole to the least loaded
// workers of the old role. With --planner-pod-labels (and
// --planner-namespace) it keeps the role label of each elastic worker's
// pod equal to the role its heartbeats say (actuator.RoleLabels, every
// tenth of the planner interval), whatever moved it; a failed patch is
// logged and counted in pdserve_planner_actuator_errors_total{op="label"}.
// The default, auto,
// runs it with the log actuator when it has a profile (--planner-profile,
// or --profile in standalone sim mode), disaggregated mode and the
// policy's TTFT and TPOT targets, and else not.
//
// Use: parse Options beside coordinator.Options, Validate with the
// completed coordinator options, New, and add the Host (when not nil) to
// coordinator.Options.Extensions before coordinator.Start; package
// coordinatorrun does this for the binary.
package plannerhost
