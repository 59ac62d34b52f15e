//go:build race

package testsvc

const raceEnabled = true
