package def

import "testing"

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "abc", 3}, {"abc", "abc", 0},
		{"kitten", "sitting", 3}, {"demo", "deom", 1}, {"ab", "ba", 1},
		{"parallel_count", "paralel_count", 1}, {"balance_count", "balanec_count", 1},
		{"ca", "abc", 3}, // optimal string alignment, not full Damerau (which says 2)
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := editDistance(tc.b, tc.a); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d (symmetry)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	groups := []string{"demo", "orders", "billing", "demo2"}
	for _, tc := range []struct {
		name  string
		cands []string
		want  string
	}{
		{"deom", groups, "demo"},
		{"Demo", groups, "demo"},
		{"order", groups, "orders"},
		{"biling", groups, "billing"},
		{"zzz", groups, ""},
		{"x", groups, ""},
		{"demo3", groups, "demo"}, // demo and demo2 are both 1 away: the first in order wins
		{"demo22", groups, "demo2"},
		{"paralel_count", []string{"parallel_count", "balance_count"}, "parallel_count"},
		{"balance", []string{"parallel_count", "balance_count"}, ""},
		{"ab", []string{"ac", "aa"}, "aa"}, // a tie goes to the first in order
		{"anything", nil, ""},
	} {
		if got := Suggest(tc.name, tc.cands); got != tc.want {
			t.Errorf("Suggest(%q, %v) = %q, want %q", tc.name, tc.cands, got, tc.want)
		}
	}
}
