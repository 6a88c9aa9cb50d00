package def

import (
	"sort"
	"strings"
)

// Suggest returns the candidate closest to name, for a "did you mean"
// after an unknown name, or "" when none is close enough to be a likely
// slip. Closeness is the edit distance with adjacent transpositions
// (optimal string alignment), ignoring case; a candidate may be at most
// len(name)/3 edits away, and at least 1 (so "deom" finds "demo"). Ties go
// to the alphabetically first candidate.
func Suggest(name string, candidates []string) string {
	limit := min(max(len(name)/3, 1), 3)
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestDist := "", limit+1
	lower := strings.ToLower(name)
	for _, c := range sorted {
		if d := editDistance(lower, strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent bytes cost 1.
func editDistance(a, b string) int {
	// Three rows of the usual dynamic programme: i-2, i-1 and i.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
