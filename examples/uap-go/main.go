// Command uap-greet is an example UAP (user application program) written
// against tpsched/shm, the only tpsched package a UAP links. scdd starts it
// as a process of user server "greet" (defs/usr/greet) and hands it calls
// through shared memory; it answers in place.
//
// Build it where the definition looks for it, then run a node:
//
//	cd examples/uap-go
//	go build -o defs/aplib/uap-greet .
//	../../bin/scdd -c defs &
//	../../bin/scdctl -c defs call greet hello world
//
// (../../bin is where make build puts scdd and scdctl; after make install
// they are on the PATH, and plain scdd and scdctl do the same.)
//
// Services (entry names as defs/usr/greet maps them):
//
//	hello  replies "hello, <request>" (from pid N)
//	upper  upper-cases the request in place and returns it
//	fail   always fails: the caller gets an application error with this text
//	count  how many calls this process has served so far
//
// What it writes to stdout and stderr goes to scdd's stderr (a UAP
// inherits scdd's), so one line at start says which process came up.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"

	"tpsched/shm"
)

func main() {
	log.SetPrefix("uap-greet: ")
	log.SetFlags(0)
	// Attach finds the process's shared memory on the descriptors and in
	// the environment scdd set up (TPSCHED_SHM_FD, ...). Run by hand, it
	// fails: a UAP only runs under scdd.
	u, err := shm.Attach()
	if err != nil {
		log.Fatal(err)
	}
	pid := os.Getpid()
	served := 0
	// req aliases shared memory and is valid only during the call: reply
	// with it, a sub-slice of it, or appended to it (its capacity reaches
	// max_message_size), but copy (bytes.Clone) whatever must outlive the
	// call.
	u.Handle("hello", func(req []byte) ([]byte, error) {
		served++
		return fmt.Appendf(nil, "hello, %s (from pid %d)", req, pid), nil
	})
	u.Handle("upper", func(req []byte) ([]byte, error) {
		served++
		for i, c := range req {
			if 'a' <= c && c <= 'z' {
				req[i] = c - 'a' + 'A'
			}
		}
		return req, nil // the reply written over the request, no copy
	})
	u.Handle("fail", func(req []byte) ([]byte, error) {
		served++
		return nil, errors.New("greet cannot do that: " + string(bytes.TrimSpace(req)))
	})
	u.Handle("count", func([]byte) ([]byte, error) {
		served++
		return strconv.AppendInt(nil, int64(served), 10), nil
	})
	log.Printf("pid %d serving group %s", pid, os.Getenv("TPSCHED_GROUP"))
	// Serve returns nil when scdd asks the process to leave (the node
	// drains, or chprc/the Multiserver rule stops it) after the call in
	// hand; Close then unmaps the shared memory.
	if err := u.Serve(); err != nil {
		log.Fatal(err)
	}
	if err := u.Close(); err != nil {
		log.Fatal(err)
	}
	log.Printf("pid %d leaves after %d calls", pid, served)
}
