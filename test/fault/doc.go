// Package fault is the fault-injection test of the gateway: a private Redis
// (AOF, fsync always) and a private NATS, three edges and two routers as real
// processes, phones that behave like the app (they ack what they show,
// and now and then sleep: their socket closed or abandoned for a stretch
// of the run, then a connection to a random edge), cron deliveries
// through the router's POST /v1/deliver with "wait":"ack" (half of them
// with a ttl, kept for a sleeping phone and owed to it), and faults drawn
// from a seeded PRNG: SIGKILL or SIGSTOP of an edge, SIGKILL of a router,
// of Redis, of NATS, and a phone's network going silent while its outbox
// is flushed. TestFaultCluster runs the same on a
// Redis Cluster (3 masters, 3 replicas) and a 3-node NATS cluster, where
// the store and bus faults are a Redis master killed (its replica
// promoted) and a NATS server killed. After the faults, a quiet phase lets
// the phones resend what is unanswered; then Check reads the recorded
// history.
//
// The package's only code is the checker (check.go), a pure function over
// the history, unit-tested on its own; the harness is in the test files:
//
//	main_test.go      builds the binaries once (TestMain)
//	process_test.go   a child process whose output goes to a log file
//	world_test.go     Redis, NATS, edges and routers, and the faults
//	silent_test.go    the blackhole of the silent-network fault
//	phone_test.go     the app-like phones and cron
//	fault_test.go     TestFault, TestFaultCluster: the run and its summary line
//
// The short form runs under go test (about a minute). FAULT_DURATION,
// FAULT_FAULTS, FAULT_PHONES and FAULT_SEED make the long form (tasks
// fault:long, fault:cluster:long); see docs/reliability.md, "The fault
// test".
package fault
