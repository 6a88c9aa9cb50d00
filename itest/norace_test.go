//go:build !race

package itest

// raceBuild: the tests run under the race detector, and so do the
// binaries they build and start (harness_test.go).
const raceBuild = false
