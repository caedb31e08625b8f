package podhelper

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeStream(t *testing.T, sections map[string]string, close bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	sw := NewStreamWriter(&buf)
	for _, name := range []string{"m0", "m1"} {
		body, ok := sections[name]
		if !ok {
			continue
		}
		require.NoError(t, sw.Section(KindFile, name, 0o755, func(w io.Writer) error {
			_, err := io.WriteString(w, body)
			return err
		}))
	}
	if close {
		require.NoError(t, sw.Close())
	} else {
		require.NoError(t, sw.w.Flush())
	}
	return buf.Bytes()
}

func TestStreamRoundTrip(t *testing.T) {
	big := strings.Repeat("x", 3*maxChunk+17)
	data := writeStream(t, map[string]string{"m0": "hello", "m1": big}, true)
	sr, err := NewStreamReader(bytes.NewReader(data))
	require.NoError(t, err)
	var got []string
	for {
		sec, body, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(body)
		require.NoError(t, err)
		assert.Equal(t, uint32(0o755), sec.Mode)
		got = append(got, sec.Name+"="+string(b[:min(len(b), 5)]))
		if sec.Name == "m1" {
			assert.Equal(t, big, string(b))
		}
	}
	assert.Equal(t, []string{"m0=hello", "m1=xxxxx"}, got)
}

func TestStreamRefusesTruncation(t *testing.T) {
	full := writeStream(t, map[string]string{"m0": strings.Repeat("y", 1000)}, true)
	for _, cut := range []int{len(full) - 1, len(full) - 5, len(full) / 2} {
		sr, err := NewStreamReader(bytes.NewReader(full[:cut]))
		require.NoError(t, err)
		var last error
		for {
			_, body, err := sr.Next()
			if err != nil {
				last = err
				break
			}
			if _, err := io.ReadAll(body); err != nil {
				last = err
				break
			}
		}
		assert.ErrorIs(t, last, ErrTruncated, "cut at %d", cut)
	}
	// Without the end line the stream is not complete.
	sr, err := NewStreamReader(bytes.NewReader(writeStream(t, map[string]string{"m0": "a"}, false)))
	require.NoError(t, err)
	_, body, err := sr.Next()
	require.NoError(t, err)
	_, err = io.ReadAll(body)
	require.NoError(t, err)
	_, _, err = sr.Next()
	assert.ErrorIs(t, err, ErrTruncated)
}

func TestStreamRefusesBadInput(t *testing.T) {
	_, err := NewStreamReader(strings.NewReader("not a stream\n"))
	require.Error(t, err)
	for _, line := range []string{"dir ../etc\n", "file m0 999\n", "dir m0 extra\n", "link m0\n", "dir /abs\n"} {
		sr, err := NewStreamReader(strings.NewReader(streamMagic + "\n" + line))
		require.NoError(t, err)
		_, _, err = sr.Next()
		assert.Error(t, err, line)
	}
	var buf bytes.Buffer
	err = NewStreamWriter(&buf).Section(KindDir, "../x", 0, func(io.Writer) error { return nil })
	assert.Error(t, err)
}

func TestGateFilterStripsLeadingTokens(t *testing.T) {
	var out bytes.Buffer
	seen := 0
	f := NewGateFilter(&out, func() { seen++ })
	stream := GateToken + GateToken + GateToken + "err1\n" + GateToken + "tail"
	// Byte by byte: tokens split across writes are still recognised.
	for i := range len(stream) {
		_, err := f.Write([]byte{stream[i]})
		require.NoError(t, err)
	}
	require.NoError(t, f.Flush())
	assert.Equal(t, 1, seen)
	assert.Equal(t, "err1\n"+GateToken+"tail", out.String(), "only leading tokens are the gate's")

	out.Reset()
	f = NewGateFilter(&out, func() {})
	_, err := f.Write([]byte("\x00taskrun"))
	require.NoError(t, err)
	require.NoError(t, f.Flush())
	assert.Equal(t, "\x00taskrun", out.String(), "a stream ending inside a would-be token keeps its bytes")
}
