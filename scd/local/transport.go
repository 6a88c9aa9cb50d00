package local

import (
	"os"
	"time"

	"tpsched/shm"
)

// proc is the node's end of one UAP process: *shm.Proc, or *sockmode.Proc
// for a socket-receiving server. Every method but Files runs under the
// group's mu.
type proc interface {
	Files() []*os.File
	PID() int
	SetPID(pid int)
	Attach() bool
	Entries() []string
	Dispatch(entry string, req []byte, deadline int64) error
	Wake()
	Completion() (shm.Completion, bool, error)
	Holding() int
	Taken() int
	Revoke() bool
	Rings() uint64
	Ignore()
	Stop()
	Left() bool
}

// transport is a group's way to its processes: *shm.Group, or
// *sockmode.Transport. Wait runs on the reply reader (reader.go), the
// rest under mu.
type transport interface {
	proc(slot int) proc
	newProc(slot int) (proc, error)
	Remove(slot int)
	Wait(timeout time.Duration)
	Close()
	Unmap() error
}

// procSource is the shape *shm.Group and *sockmode.Transport share.
type procSource[P interface {
	proc
	comparable
}] interface {
	Proc(slot int) P
	NewProc(slot int) (P, error)
	Remove(slot int)
	Wait(timeout time.Duration)
	Close()
	Unmap() error
}

// transportOf makes a procSource a transport.
type transportOf[P interface {
	proc
	comparable
}] struct{ procSource[P] }

func (t transportOf[P]) proc(slot int) proc {
	var none P
	if p := t.Proc(slot); p != none {
		return p
	}
	return nil
}

func (t transportOf[P]) newProc(slot int) (proc, error) {
	p, err := t.NewProc(slot)
	if err != nil {
		return nil, err
	}
	return p, nil
}
