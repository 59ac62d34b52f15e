package testsvc

import "time"

// Slack scales a bound on elapsed time for how the test runs: 4× under the
// race detector, which slows code 2–20×. A test asserts with it that
// something happened promptly, never that it took a given time.
func Slack(d time.Duration) time.Duration {
	if raceEnabled {
		return 4 * d
	}
	return d
}
