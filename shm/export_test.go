package shm

// StartProcess is startProcess for the external tests (protocol_test.go).
var StartProcess = startProcess
