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
