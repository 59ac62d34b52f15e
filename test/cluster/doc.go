// Package cluster holds the multi-process tests of the gateway: the real
// binaries of services/edge and services/router, built once by TestMain and
// started with os/exec on loopback ports, against a real Redis and a real
// NATS. They prove what only a cluster can get wrong: delivery through the
// router to a device on another edge, takeover of a device across edges
// (also when two hellos race), dedup, cards and upload limits across edges,
// and an edge killed with SIGKILL whose devices reconnect elsewhere and get
// what the agent said meanwhile, in order and once.
//
// The package has no code of its own; everything is in its test files:
//
//	main_test.go      builds the binaries once (TestMain)
//	services_test.go  finds or starts Redis and NATS
//	process_test.go   a child process whose output goes to t.Log
//	cluster_test.go   a cluster: NATS, edges A and B, a router; phones, the
//	                  router's HTTP API, and waitReachable
//	slowbus_test.go   a TCP link that delays what a process sends to NATS,
//	                  and the tests that need one
//	upgrade_test.go   a cluster of the release before owners (a commit
//	                  of the history, built with git archive and the module
//	                  cache) upgraded node by node to this build
//	the others        the tests, one file per property: delivery, takeover,
//	                  dedup, cards, uploads, failover
//
// # Services
//
// Redis: REDIS_URL when set, else 127.0.0.1:6379 when it answers, else a
// redis-server from PATH (or /usr/bin) started for the package. Every test
// uses a random REDIS_PREFIX, and its keys are deleted when it ends.
//
// NATS: every test starts a nats-server of its own (from PATH or /usr/sbin)
// on a random port. The bus subjects have no prefix (hermes.in, queue group
// routers; hermes.dev.<device>), so two clusters on one NATS take each
// other's events: a router of another test, or of pkg/gateway's cluster test
// running in parallel, would answer this test's phones. Without a
// nats-server binary the tests use NATS_URL, else 127.0.0.1:4222, one test at
// a time (and may still meet another package's router there).
//
// The start-up tests (startup_test.go) start an edge and a router before
// their Redis and NATS, each a redis-server and a nats-server of the test's
// own on free loopback ports, started later (from PATH, /usr/bin or
// /usr/sbin).
//
// The upgrade test needs git and the commit in the clone's history (not a
// shallow clone); its binaries are built once per machine into the system's
// temporary directory.
//
// Without the services the tests skip, saying how to enable them; with CI
// set they fail instead. TestMain builds services/edge and services/router;
// if either does not build, every test fails.
package cluster
