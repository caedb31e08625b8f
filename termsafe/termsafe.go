// Package termsafe renders untrusted bytes harmless for a terminal.
//
// A run's output is written by the agent, so sent to a terminal verbatim it
// could set the window title, clear the screen, write the clipboard (OSC 52),
// hide later lines or fake taskrun's own messages. Writer and String keep
// printable text, newlines, carriage returns and tabs, and show everything
// else as visible text:
//
//   - C0 controls and DEL as caret notation: ESC is ^[, BEL is ^G, DEL is ^?;
//   - C1 controls (U+0080..U+009F) and bidirectional-text controls
//     (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069) as \u009b;
//   - bytes that are not valid UTF-8 as \x9b.
//
// Every escape sequence (CSI, OSC, DCS, APC, PM, SOS) starts with ESC or a
// C1 control, so neutralizing those two neutralizes every sequence, however
// it is split across writes. Output never contains a byte below 0x20 other
// than \t, \n and \r, nor DEL, nor a C1 control in any encoding.
package termsafe

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// chunkSize bounds how much input one pass escapes, and so the Writer's
// buffers: the escaped form of a byte is at most 4 bytes (\xNN), of a
// character at most 6 (\u009b).
const chunkSize = 16 << 10

// Writer escapes everything written to it and writes the result to the
// underlying writer. It holds at most utf8.UTFMax-1 bytes of an incomplete
// character between writes; Flush writes them out (escaped, when the stream
// ends mid-character). A Writer is not safe for concurrent use.
type Writer struct {
	w       io.Writer
	pending [utf8.UTFMax]byte
	npend   int
	join    []byte // pending bytes followed by the next chunk
	buf     []byte // escaped output of one chunk
}

// NewWriter returns a Writer that writes the escaped form of its input to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w}
}

// Write escapes p and writes it to the underlying writer. It returns len(p)
// when the underlying write succeeded: the count is of input bytes consumed.
func (t *Writer) Write(p []byte) (int, error) {
	for n := 0; n < len(p); {
		end := min(len(p), n+chunkSize)
		chunk := p[n:end]
		if t.npend > 0 {
			// A character split by the previous write: finish it first.
			t.join = append(append(t.join[:0], t.pending[:t.npend]...), chunk...)
			chunk, t.npend = t.join, 0
		}
		t.buf = t.buf[:0]
		t.appendEscaped(chunk, false)
		if len(t.buf) > 0 {
			if _, err := t.w.Write(t.buf); err != nil {
				return n, err
			}
		}
		n = end
	}
	return len(p), nil
}

// Flush writes out an incomplete character held from the last write, escaped
// byte by byte. Call it when the stream ends.
func (t *Writer) Flush() error {
	if t.npend == 0 {
		return nil
	}
	t.buf = t.buf[:0]
	for _, b := range t.pending[:t.npend] {
		t.buf = appendInvalid(t.buf, b)
	}
	t.npend = 0
	_, err := t.w.Write(t.buf)
	return err
}

// appendEscaped appends the escaped form of p to t.buf. Unless final, an
// incomplete character at the end of p is kept in t.pending instead.
func (t *Writer) appendEscaped(p []byte, final bool) {
	i := 0
	for i < len(p) {
		// Fast path: a run of printable ASCII.
		start := i
		for i < len(p) && p[i] >= 0x20 && p[i] < 0x7f {
			i++
		}
		t.buf = append(t.buf, p[start:i]...)
		if i == len(p) {
			break
		}
		if !final && !utf8.FullRune(p[i:]) {
			t.npend = copy(t.pending[:], p[i:])
			return
		}
		_, size := utf8.DecodeRune(p[i:])
		t.buf = appendRune(t.buf, p[i:i+size])
		i += size
	}
}

// String returns s escaped for a terminal, for names and messages that come
// from untrusted input.
func String(s string) string {
	t := Writer{buf: make([]byte, 0, len(s))}
	t.appendEscaped([]byte(s), true)
	return string(t.buf)
}

// appendRune appends the safe form of one encoded rune, or of one invalid
// byte when enc is not valid UTF-8 (then len(enc) is 1).
func appendRune(buf, enc []byte) []byte {
	r, size := utf8.DecodeRune(enc)
	if r == utf8.RuneError && size <= 1 {
		return appendInvalid(buf, enc[0])
	}
	switch {
	case r == '\t' || r == '\n' || r == '\r':
		return append(buf, byte(r))
	case r < 0x20:
		return append(buf, '^', byte(r)+'@')
	case r == 0x7f:
		return append(buf, '^', '?')
	case isC1(r) || isBidiControl(r):
		return fmt.Appendf(buf, `\u%04x`, r)
	}
	return append(buf, enc...)
}

func appendInvalid(buf []byte, b byte) []byte {
	const hex = "0123456789abcdef"
	return append(buf, '\\', 'x', hex[b>>4], hex[b&0xf])
}

func isC1(r rune) bool { return r >= 0x80 && r <= 0x9f }

// isBidiControl reports the invisible controls that reorder displayed text.
func isBidiControl(r rune) bool {
	switch {
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e:
		return true
	case r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}
