package persist

import (
	"fmt"
	"strconv"
	"strings"
)

// The file bucket names an object's file as gocloud's fileblob did: the key
// with every "/" a directory separator and the runes below escaped as
// "__0x<hex>__" (the mapping of gocloud's internal escape.HexEscape with
// fileblob's rules), so stores written by either read the same.
//
// Escaped are control characters, the "/" of a "../" or a "//", a trailing
// "/", and the start of any text that would itself read as an escape: a
// literal "__0x41__" in a key is stored as "__0x5f___0x41__", never as the
// "A" it would unescape to.

// escapeKey is the relative file path of key, with "/" separators.
func escapeKey(key string) string {
	r := []rune(key)
	esc := make([]bool, len(r))
	var pending []int
	n := 0
	for i, c := range r {
		if c < 32 || (c == '/' && ((i > 1 && r[i-1] == '.' && r[i-2] == '.') || (i > 0 && r[i-1] == '/') || i == len(r)-1)) || isEscape(r, i) {
			esc[i] = true
			pending = append(pending, i)
			n++
		}
	}
	for len(pending) > 0 {
		i := pending[len(pending)-1]
		pending = pending[:len(pending)-1]
		if j, ok := danglingEscape(r, i); ok && !esc[j] {
			esc[j] = true
			pending = append(pending, j)
			n++
		}
	}
	if n == 0 {
		return key
	}
	var b strings.Builder
	for i, c := range r {
		if esc[i] {
			fmt.Fprintf(&b, "__%#x__", c)
		} else {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// unescapeKey is the key of a file's relative path (escapeKey reversed).
func unescapeKey(path string) string {
	if !strings.Contains(path, "__0x") {
		return path
	}
	r := []rune(path)
	var b strings.Builder
	for i := 0; i < len(r); i++ {
		if c, end, ok := unescapeAt(r, i); ok {
			b.WriteRune(c)
			i = end
			continue
		}
		b.WriteRune(r[i])
	}
	return b.String()
}

// isEscape reports whether an escape sequence starts at r[i].
func isEscape(r []rune, i int) bool {
	_, _, ok := unescapeAt(r, i)
	return ok
}

// unescapeAt reads "__0x<hex>__" at r[i]: the rune and the index of its
// last "_".
func unescapeAt(r []rune, i int) (rune, int, bool) {
	if i+4 > len(r) || string(r[i:i+4]) != "__0x" {
		return 0, 0, false
	}
	j := i + 4
	for j < len(r) && r[j] != '_' {
		j++
	}
	if j+1 >= len(r) || r[j+1] != '_' {
		return 0, 0, false
	}
	v, err := strconv.ParseInt(string(r[i+4:j]), 16, 32)
	if err != nil {
		return 0, 0, false
	}
	return rune(v), j + 1, true
}

// danglingEscape finds the "__0x<hex>" or "__0x<hex>_" that ends right
// before r[end]: the "__" an escape at end emits would complete it, so its
// first "_" (the index returned) is escaped too.
func danglingEscape(r []rune, end int) (int, bool) {
	if end > 0 && r[end-1] == '_' {
		end--
	}
	start := end
	for start > 0 && r[start-1] != '_' {
		start--
	}
	if start < 2 || end-start < 2 || r[start] != '0' || r[start+1] != 'x' || r[start-2] != '_' {
		return 0, false
	}
	if _, err := strconv.ParseInt(string(r[start+2:end]), 16, 32); err != nil {
		return 0, false
	}
	return start - 2, true
}
