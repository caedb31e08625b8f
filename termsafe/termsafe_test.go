package termsafe_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/termsafe"
)

// escape writes each part with its own Write call, then flushes.
func escape(t *testing.T, parts ...string) string {
	t.Helper()
	var out bytes.Buffer
	w := termsafe.NewWriter(&out)
	for _, p := range parts {
		n, err := w.Write([]byte(p))
		require.NoError(t, err)
		require.Equal(t, len(p), n)
	}
	require.NoError(t, w.Flush())
	return out.String()
}

// assertInert fails when s holds a byte a terminal would act on.
func assertInert(t *testing.T, s string) {
	t.Helper()
	for i := 0; i < len(s); i++ {
		b := s[i]
		if (b < 0x20 && b != '\t' && b != '\n' && b != '\r') || b == 0x7f {
			t.Fatalf("control byte %#x at %d in %q", b, i, s)
		}
	}
	require.True(t, utf8.ValidString(s), "output is valid UTF-8: %q", s)
	for _, r := range s {
		if r >= 0x80 && r <= 0x9f {
			t.Fatalf("C1 control %U in %q", r, s)
		}
	}
}

func TestTextPassesThrough(t *testing.T) {
	in := "plain text, tabs\tand\r\nnewlines; UTF-8: héllo, 日本語, emoji 🎉\n"
	assert.Equal(t, in, escape(t, in))
	assert.Equal(t, in, termsafe.String(in))
}

func TestAttacksAreShownNotObeyed(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"clipboard write (OSC 52)", "\x1b]52;c;cm0gLXJmIH4=\x07", "^[]52;c;cm0gLXJmIH4=^G"},
		{"clipboard write, ST-terminated", "\x1b]52;c;aGk=\x1b\\", `^[]52;c;aGk=^[\`},
		{"window title", "\x1b]0;pwned\x07", "^[]0;pwned^G"},
		{"window title, 8-bit OSC in UTF-8", "\u009d2;pwned\u009c", `\u009d2;pwned\u009c`},
		{"clear screen", "\x1b[2J\x1b[H", "^[[2J^[[H"},
		{"8-bit CSI byte", "\x9b2J", `\x9b2J`},
		{"hide what follows", "\x1b[8m", "^[[8m"},
		{"device control string", "\x1bP+q544e\x1b\\", `^[P+q544e^[\`},
		{"backspace over text", "ok\b\bNO", "ok^H^HNO"},
		{"bell and NUL", "\a\x00", "^G^@"},
		{"DEL", "\x7f", "^?"},
		{"bidi override", "abc\u202edcba", `abc\u202edcba`},
		{"invalid UTF-8", "\xff\xfe", `\xff\xfe`},
		{"overlong encoding of ESC", "\xc0\x9b", `\xc0\x9b`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := escape(t, tc.in)
			assert.Equal(t, tc.want, got)
			assertInert(t, got)
			assert.Equal(t, tc.want, termsafe.String(tc.in))
		})
	}
}

// An agent printing taskrun's own verdict, then trying to hide the real one
// (erase line, move the cursor, conceal), only shows its attempt.
func TestFakeVerdictLineIsVisiblyAgentOutput(t *testing.T) {
	in := "\x1b[2K\r\x1b[1A\nrun r1: SUCCEEDED (exit 0)\n\x1b[8m\x1b]0;done\x07"
	got := escape(t, in)
	assertInert(t, got)
	assert.Equal(t, "^[[2K\r^[[1A\nrun r1: SUCCEEDED (exit 0)\n^[[8m^[]0;done^G", got)
}

// A sequence split anywhere across writes is neutralized exactly as whole.
func TestSplitWritesEscapeLikeOneWrite(t *testing.T) {
	in := "a\x1b]52;c;aGk=\x07é日🎉\xff\u009b\u202e\x1b[2Jz"
	want := escape(t, in)
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			assert.Equal(t, want, escape(t, in[:i], in[i:j], in[j:]), "split at %d and %d", i, j)
		}
	}
	// Byte by byte.
	parts := make([]string, len(in))
	for i := 0; i < len(in); i++ {
		parts[i] = in[i : i+1]
	}
	assert.Equal(t, want, escape(t, parts...))
}

// A stream that ends inside a character shows the dangling bytes on Flush.
func TestFlushShowsAnIncompleteCharacter(t *testing.T) {
	var out bytes.Buffer
	w := termsafe.NewWriter(&out)
	_, err := w.Write([]byte("x\xe6\x97"))
	require.NoError(t, err)
	assert.Equal(t, "x", out.String(), "an incomplete character waits for its next bytes")
	require.NoError(t, w.Flush())
	assert.Equal(t, `x\xe6\x97`, out.String())
	require.NoError(t, w.Flush(), "a second flush has nothing to write")
	assert.Equal(t, `x\xe6\x97`, out.String())
}

// Large writes are escaped in bounded chunks, and a character split across a
// chunk boundary survives.
func TestLargeWrites(t *testing.T) {
	in := strings.Repeat("日本\x1b", 20000) // 140,000 bytes
	got := escape(t, in)
	assert.Equal(t, strings.Repeat("日本^[", 20000), got)
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("closed") }

func TestWriteErrorIsReturned(t *testing.T) {
	_, err := termsafe.NewWriter(failingWriter{}).Write([]byte("x"))
	assert.Error(t, err)
}

// Whatever the input and however it is split, the output holds no byte a
// terminal would act on, and splitting does not change it.
func FuzzWriterOutputIsInert(f *testing.F) {
	for _, seed := range []string{"", "plain\n", "\x1b]52;c;aGk=\x07", "\x9b2J", "\xc2\x9b", "日\xe6\x97", "\u202e", "\x1bP\x1b\\"} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, split uint8) {
		whole := escape(t, string(in))
		assertInert(t, whole)
		at := 0
		if len(in) > 0 {
			at = int(split) % (len(in) + 1)
		}
		assert.Equal(t, whole, escape(t, string(in[:at]), string(in[at:])))
		assert.Equal(t, whole, termsafe.String(string(in)))
	})
}

// BenchmarkWriter measures escaping throughput on typical agent output:
// mostly text, some UTF-8, an escape sequence per line.
func BenchmarkWriter(b *testing.B) {
	line := []byte("step 12: editing greet.go — fixed the TODO \x1b[32mok\x1b[0m\n")
	chunk := bytes.Repeat(line, 512)
	w := termsafe.NewWriter(io.Discard)
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		if _, err := w.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
}
