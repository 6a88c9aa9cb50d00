package def

import (
	"errors"
	"sort"
	"strings"
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
