// Package standalone runs a whole pdserve deployment in one process: the
// coordinator (package coordinator) and its prefill and decode (or
// colocated) workers (package workerrun), for `coordinator --standalone`,
// demos and tests.
//
// Start takes the coordinator's Options with Standalone set
// (PrefillWorkers, DecodeWorkers, Engine, …; WithWorkerOptions edits the
// workers' options in code; WithElasticWorkers starts them elastic, movable
// between the roles by the coordinator's role commands) and, in order:
//
//  1. generates an Ed25519 key pair when GRPCAuth has neither a token
//     nor a signing key (the coordinator signs per-call credentials, the
//     workers hold the public key, in memory), so that nothing else on the
//     machine can call the workers; with TLS and no worker identities
//     given, the coordinator accepts any certificate the CA signed for its
//     workers, which share its certificate;
//  2. without NATSURL, starts the embedded NATS server (NATSListen, by
//     default a free port on loopback) with generated users: one for the
//     coordinator, one per worker bound to its id, plus those of
//     NATSAuthFile and NATSUsers. With NATSURL the workers log in with the
//     coordinator's credentials (that user then needs every role's
//     permissions);
//  3. starts the workers, their metrics in the coordinator's registry;
//  4. starts the coordinator (coordinator.Start) on that NATS server,
//     tokenizing with the first worker's engine, with an extension that
//     warns a request whose workers' sim engines fell behind their model
//     meanwhile (overrun.go: the request's times are then the machine's,
//     not the modeled GPU's).
//
// Shutdown stops it in the order that lets requests finish: the
// coordinator's HTTP drain, then the workers (coordinator
// Options.BeforeNATSDrain), then the coordinator's NATS connection, then
// the embedded NATS server.
package standalone
