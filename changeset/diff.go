package changeset

import (
	"bytes"
	"fmt"
	"io"
)

// contextLines is how many unchanged lines surround each hunk, as in git.
const contextLines = 3

// maxEditDistance bounds the Myers search. Files whose lines differ by more
// edits (after their common head and tail are removed) get one hunk that
// replaces the differing middle: still a correct patch, only not minimal.
const maxEditDistance = 1000

// maxDiffWork bounds lines × edit distance explored for one file.
const maxDiffWork = 50_000_000

// edit is one line of an edit script: ' ' keeps, '-' deletes, '+' inserts.
type edit struct {
	op   byte
	line []byte
}

// splitLines cuts b into lines that keep their "\n"; the last line may lack one.
func splitLines(b []byte) [][]byte {
	var lines [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			lines = append(lines, b)
			break
		}
		lines = append(lines, b[:i+1])
		b = b[i+1:]
	}
	return lines
}

// diffLines returns an edit script turning a into b.
func diffLines(a, b [][]byte) []edit {
	head := 0
	for head < len(a) && head < len(b) && bytes.Equal(a[head], b[head]) {
		head++
	}
	tail := 0
	for tail < len(a)-head && tail < len(b)-head && bytes.Equal(a[len(a)-1-tail], b[len(b)-1-tail]) {
		tail++
	}
	var out []edit
	for _, l := range a[:head] {
		out = append(out, edit{' ', l})
	}
	ma, mb := a[head:len(a)-tail], b[head:len(b)-tail]
	// Bound the search's work, about (lines × edits), for huge files.
	budget := maxEditDistance
	if n := len(ma) + len(mb); n > 0 {
		budget = min(budget, maxDiffWork/n)
	}
	mid, ok := myers(ma, mb, budget)
	if !ok {
		mid = mid[:0]
		for _, l := range ma {
			mid = append(mid, edit{'-', l})
		}
		for _, l := range mb {
			mid = append(mid, edit{'+', l})
		}
	}
	out = append(out, mid...)
	for _, l := range a[len(a)-tail:] {
		out = append(out, edit{' ', l})
	}
	return out
}

// myers finds a shortest edit script from a to b (Myers 1986) if one with at
// most maxD edits exists. Memory is O(maxD²) integers.
func myers(a, b [][]byte, maxD int) ([]edit, bool) {
	n, m := len(a), len(b)
	maxD = min(maxD, n+m)
	off := maxD + 1
	v := make([]int, 2*maxD+3)
	var trace [][]int
	for d := 0; d <= maxD; d++ {
		trace = append(trace, append([]int(nil), v[off-d:off+d+1]...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && bytes.Equal(a[x], b[y]) {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				return backtrack(a, b, trace, d), true
			}
		}
	}
	return nil, false
}

// backtrack walks the saved V arrays back from (len(a), len(b)) at step d.
func backtrack(a, b [][]byte, trace [][]int, d int) []edit {
	x, y := len(a), len(b)
	var rev []edit
	for ; d > 0; d-- {
		prev := trace[d] // V after step d-1, indexed k+d
		at := func(k int) int { return prev[k+d] }
		k := x - y
		var prevK int
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			prevK = k + 1
		} else {
			prevK = k - 1
		}
		prevX := at(prevK)
		prevY := prevX - prevK
		for x > prevX && y > prevY {
			x--
			y--
			rev = append(rev, edit{' ', a[x]})
		}
		if x == prevX {
			y--
			rev = append(rev, edit{'+', b[y]})
		} else {
			x--
			rev = append(rev, edit{'-', a[x]})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, edit{' ', a[x]})
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

// writeHunks writes the unified-diff hunks of script to w, with
// contextLines of context and hunks closer than twice that merged, and
// returns the number of inserted and deleted lines.
func writeHunks(w io.Writer, script []edit) (ins, del int, err error) {
	// oldBefore[i] and newBefore[i] count the lines before script[i].
	oldBefore := make([]int, len(script)+1)
	newBefore := make([]int, len(script)+1)
	var changes []int
	for i, e := range script {
		oldBefore[i+1], newBefore[i+1] = oldBefore[i], newBefore[i]
		if e.op != '+' {
			oldBefore[i+1]++
		}
		if e.op != '-' {
			newBefore[i+1]++
		}
		if e.op != ' ' {
			changes = append(changes, i)
		}
	}
	for h := 0; h < len(changes); {
		start := max(0, changes[h]-contextLines)
		last := changes[h]
		for h++; h < len(changes) && changes[h]-last-1 <= 2*contextLines; h++ {
			last = changes[h]
		}
		end := min(len(script), last+1+contextLines)
		oldN := oldBefore[end] - oldBefore[start]
		newN := newBefore[end] - newBefore[start]
		if _, err := fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(oldBefore[start], oldN), hunkRange(newBefore[start], newN)); err != nil {
			return ins, del, err
		}
		for _, e := range script[start:end] {
			if err := writeLine(w, e); err != nil {
				return ins, del, err
			}
			switch e.op {
			case '+':
				ins++
			case '-':
				del++
			}
		}
	}
	return ins, del, nil
}

// hunkRange formats one side of a hunk header; an empty side names the line
// before it, as unified diffs do.
func hunkRange(before, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", before)
	}
	return fmt.Sprintf("%d,%d", before+1, n)
}

func writeLine(w io.Writer, e edit) error {
	line := e.line
	noEOL := len(line) == 0 || line[len(line)-1] != '\n'
	if _, err := w.Write([]byte{e.op}); err != nil {
		return err
	}
	if _, err := w.Write(line); err != nil {
		return err
	}
	if noEOL {
		_, err := io.WriteString(w, "\n\\ No newline at end of file\n")
		return err
	}
	return nil
}
