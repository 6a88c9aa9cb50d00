package netio

import (
	"errors"
	"reflect"
	"testing"
)

func TestLookupAnswerRoundTrip(t *testing.T) {
	for _, nodes := range [][]NodeLevel{
		{},
		{{Addr: "127.0.0.2:12000", Level: 0}},
		{{Addr: "10.0.0.1:1", Level: 2}, {Addr: "[::1]:12000", Level: 1}},
	} {
		got, err := ParseLookupAnswer(AppendLookupAnswer(nil, nodes))
		if err != nil || !reflect.DeepEqual(got, nodes) {
			t.Errorf("round trip of %v: %v, %v", nodes, got, err)
		}
	}
}

func TestLookupAnswerBad(t *testing.T) {
	good := AppendLookupAnswer(nil, []NodeLevel{{Addr: "h:1", Level: 1}})
	for name, b := range map[string][]byte{
		"empty":      nil,
		"truncated":  good[:len(good)-1],
		"trailing":   append(append([]byte(nil), good...), 0),
		"level 3":    {1, 3, 3, 'h', ':', '1'},
		"empty addr": {1, 0, 0},
		"huge count": {0xff, 0xff, 0x03},
	} {
		if _, err := ParseLookupAnswer(b); !errors.Is(err, ErrBadLookupAnswer) {
			t.Errorf("%s: %v; want ErrBadLookupAnswer", name, err)
		}
	}
}

func TestReceiversAnswer(t *testing.T) {
	for _, r := range []Receivers{{Group: "", Addr: "127.0.0.1:12000", Count: 4, Here: 2}, {Group: "heavy", Addr: "h:1", Count: 1, Here: -1}} {
		got, err := ParseReceivers(AppendReceivers(nil, r))
		if err != nil || got != r {
			t.Fatalf("%+v came back as %+v, %v", r, got, err)
		}
	}
	good := AppendReceivers(nil, Receivers{Group: "g", Addr: "a:1", Count: 2, Here: 1})
	for i := range len(good) {
		if _, err := ParseReceivers(good[:i]); err == nil {
			t.Fatalf("cut at %d: no error", i)
		}
	}
	if _, err := ParseReceivers(append(good, 0)); err == nil {
		t.Fatal("a trailing byte: no error")
	}
	if _, err := ParseReceivers(AppendReceivers(nil, Receivers{Addr: "a:1", Count: 2, Here: 2})); err == nil {
		t.Fatal("here beyond count: no error")
	}
}
