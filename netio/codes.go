package netio

import "fmt"

// Code is the reason carried by a KindError frame. The names follow
// OpenTP1's error codes so operators recognise them.
type Code uint8

const (
	CodeOK               Code = 0
	CodeNoSuchGroup      Code = 1  // DCRPCER_NO_SUCH_SERVICE_GROUP
	CodeNoSuchService    Code = 2  // DCRPCER_NO_SUCH_SERVICE
	CodeServiceClosed    Code = 3  // DCRPCER_SERVICE_CLOSED: the group is held
	CodeServerBusy       Code = 4  // DCRPCER_SERVER_BUSY: the schedule queue is full
	CodeTimedOut         Code = 5  // DCRPCER_TIMED_OUT: watch_time passed
	CodeMessageTooBig    Code = 6  // DCRPCER_MESSAGE_TOO_BIG
	CodeServerTerminated Code = 7  // DCRPCER_SERVICE_TERMINATED: the UAP died during the call
	CodeNetworkDown      Code = 8  // DCRPCER_NET_DOWN: no node could be reached
	CodeProtocol         Code = 9  // DCRPCER_PROTO: the peer sent something we cannot read
	CodeApplication      Code = 10 // the service returned an error; the payload is its message
	CodeShuttingDown     Code = 11 // the node is draining and takes no new work
	// CodeWrongReceiver: the call came to a receiver group that does not
	// take its service group's calls (scdmulti -g); it did not run. A
	// receivers lookup (LookupReceivers) says where to send it.
	CodeWrongReceiver Code = 12
	codeMax                = CodeWrongReceiver
)

var codeNames = [...]string{
	CodeOK:               "ok",
	CodeNoSuchGroup:      "no such service group",
	CodeNoSuchService:    "no such service",
	CodeServiceClosed:    "service closed",
	CodeServerBusy:       "server busy",
	CodeTimedOut:         "timed out",
	CodeMessageTooBig:    "message too big",
	CodeServerTerminated: "server terminated",
	CodeNetworkDown:      "network down",
	CodeProtocol:         "protocol error",
	CodeApplication:      "application error",
	CodeShuttingDown:     "node shutting down",
	CodeWrongReceiver:    "wrong receiver",
}

func (c Code) String() string {
	if c <= codeMax {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// Error is a failed call as a Go error. Callers switch on Code with
// errors.As, or compare with errors.Is against a bare Error{Code: ...}.
type Error struct {
	Code    Code
	Message string // detail from the node or the service, may be empty
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "tpsched: " + e.Code.String()
	}
	return "tpsched: " + e.Code.String() + ": " + e.Message
}

// Is makes errors.Is(err, &netio.Error{Code: c}) match any error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Codes are the codes an error frame can carry, in order.
func Codes() []Code {
	out := make([]Code, 0, codeMax)
	for c := CodeOK + 1; c <= codeMax; c++ {
		out = append(out, c)
	}
	return out
}
