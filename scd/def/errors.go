package def

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Errors is every error found in the definitions when there is more than
// one: Load (and Parse, for one file) goes on after an error so that an
// operator fixes a directory in one round (scdd -check prints them all).
// They come in the order the files are read (sysconf, scdsvcdef, usrrc,
// usr/ by name, svcpolicy), by line within a file; each is an *Error where
// it has a file and line. Error prints one per line.
type Errors []error

func (e Errors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap lets errors.As and errors.Is look at every error.
func (e Errors) Unwrap() []error { return e }

// List returns the errors err holds: every one of an Errors, or err
// itself; none for nil.
func List(err error) []error {
	if err == nil {
		return nil
	}
	var es Errors
	if errors.As(err, &es) {
		return es
	}
	return []error{err}
}

// collector gathers the errors of a load.
type collector struct{ errs []error }

// add records err (nil is nothing; an Errors adds each of its own) and
// reports whether there was one.
func (c *collector) add(err error) bool {
	if err == nil {
		return false
	}
	var es Errors
	if errors.As(err, &es) {
		c.errs = append(c.errs, es...)
	} else {
		c.errs = append(c.errs, err)
	}
	return true
}

// err is nil, the one error, or Errors in file order and by line.
func (c *collector) err() error {
	switch len(c.errs) {
	case 0:
		return nil
	case 1:
		return c.errs[0]
	}
	out := append(Errors(nil), c.errs...)
	sort.SliceStable(out, func(i, j int) bool {
		fi, li := errPlace(out[i])
		fj, lj := errPlace(out[j])
		if fi != fj {
			return fi < fj
		}
		return li < lj
	})
	return out
}

// errPlace orders an error: by its file in reading order (a name within
// usr/), then its line. An error without a file stays after the files'.
func errPlace(err error) (string, int) {
	var e *Error
	if !errors.As(err, &e) {
		return "9", 0
	}
	rank := "8"
	switch {
	case e.File == "sysconf":
		rank = "0"
	case e.File == "scdsvcdef":
		rank = "1"
	case e.File == "usrrc":
		rank = "2"
	case strings.HasPrefix(e.File, "usr/"):
		rank = "3"
	case e.File == FilePolicy:
		rank = "4"
	}
	return rank + e.File, e.Line
}

// maxShown is how many runes of a value an error repeats.
const maxShown = 64

// shown is a value read from a definition (an operand's value, a token of
// a statement) as an error repeats it: whole when it is short, else its
// first maxShown runes, an ellipsis and its length. A value of 200 KB made
// an error line of 200 KB, in scdd's log and on scdd -check's screen,
// where the start of it says which value it is. Every error of this
// package that repeats such a value formats it through shown: %q quotes
// the runes kept, "aaa…" (200000 bytes); %s and %v give them bare,
// aaa… (200000 bytes).
type shown string

func (v shown) Format(f fmt.State, verb rune) {
	s, cut := v.head()
	if verb == 'q' {
		s = strconv.Quote(s)
	}
	io.WriteString(f, s)
	if cut {
		fmt.Fprintf(f, "… (%d bytes)", len(v))
	}
}

// head is what Format keeps of v, and whether that is less than v.
func (v shown) head() (string, bool) {
	end := 0
	for runes := 0; end < len(v) && runes < maxShown; runes++ {
		_, n := utf8.DecodeRuneInString(string(v[end:])) // a byte that is no UTF-8 counts as one
		end += n
	}
	return string(v[:end]), end < len(v)
}
