package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// httpCaller speaks HTTP/1.1 with keep-alive: POST path with the payload as
// the body, the reply body must be the payload. It is written out by hand
// so the load generator spends as little of the shared CPU as the tpsched
// one does.
type httpCaller struct {
	connCaller
	path string
	out  []byte
	body []byte
}

// httpDialer posts to http://addr/path.
func httpDialer(addr, path string) dialer {
	return func() caller {
		return &httpCaller{connCaller: connCaller{addr: addr}, path: path}
	}
}

func (c *httpCaller) Call(payload []byte, deadline time.Time) (outcome, error) {
	nc, r, err := c.conn()
	if err != nil {
		return callFailed, nil
	}
	c.setDeadline(nc, deadline)
	c.out = append(c.out[:0], "POST "...)
	c.out = append(c.out, c.path...)
	c.out = append(c.out, " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: "...)
	c.out = strconv.AppendInt(c.out, int64(len(payload)), 10)
	c.out = append(c.out, "\r\n\r\n"...)
	c.out = append(c.out, payload...)
	if _, err := nc.Write(c.out); err != nil {
		return c.ioOutcome(err)
	}
	status, body, keep, err := readResponse(r, c.body[:0])
	c.body = body
	if err != nil {
		var pe protocolError
		if errors.As(err, &pe) {
			return callFailed, err
		}
		return c.ioOutcome(err)
	}
	if !keep {
		c.drop()
	}
	switch {
	case status >= 200 && status < 300:
		return callOK, checkEcho(body, payload)
	case status >= 500:
		return callRefused, nil
	}
	return callFailed, nil
}

type protocolError string

func (e protocolError) Error() string { return "bench: http: " + string(e) }

// lineReader is what readResponse needs of a bufio.Reader.
type lineReader interface {
	io.Reader
	ReadSlice(delim byte) ([]byte, error)
}

// readResponse reads one HTTP/1.1 response, appending its body to body. It
// understands Content-Length and chunked bodies and reports whether the
// connection may be used again.
func readResponse(r lineReader, body []byte) (status int, out []byte, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, body, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, body, false, protocolError(fmt.Sprintf("bad status line %q", line))
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, body, false, protocolError(fmt.Sprintf("bad status line %q", line))
	}
	keep = line[7] == '1' // HTTP/1.1 keeps the connection unless told otherwise
	length, chunked := -1, false
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return status, body, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return status, body, false, protocolError(fmt.Sprintf("bad header %q", line))
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.Atoi(string(value))
			if err != nil || length < 0 {
				return status, body, false, protocolError(fmt.Sprintf("bad Content-Length %q", value))
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				keep = false
			} else if bytes.EqualFold(value, []byte("keep-alive")) {
				keep = true
			}
		}
	}
	switch {
	case chunked:
		for {
			line, err = r.ReadSlice('\n')
			if err != nil {
				return status, body, false, err
			}
			size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
			n, perr := strconv.ParseInt(string(bytes.TrimSpace(size)), 16, 64)
			if perr != nil || n < 0 {
				return status, body, false, protocolError(fmt.Sprintf("bad chunk size %q", line))
			}
			if n == 0 {
				break
			}
			if body, err = readN(r, body, int(n)); err != nil {
				return status, body, false, err
			}
			if _, err = r.ReadSlice('\n'); err != nil {
				return status, body, false, err
			}
		}
		for { // trailers
			line, err = r.ReadSlice('\n')
			if err != nil {
				return status, body, false, err
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				return status, body, keep, nil
			}
		}
	case length >= 0:
		body, err = readN(r, body, length)
		return status, body, keep && err == nil, err
	case status == 204 || status == 304:
		return status, body, keep, nil
	}
	// No length: the body runs to the end of the connection.
	all, err := io.ReadAll(r)
	return status, append(body, all...), false, err
}

func readN(r io.Reader, body []byte, n int) ([]byte, error) {
	off := len(body)
	body = append(body, make([]byte, n)...)
	_, err := io.ReadFull(r, body[off:])
	return body, err
}
