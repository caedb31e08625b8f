package daemon

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckPorts(t *testing.T) {
	require.NoError(t, checkPorts(nil))
	require.NoError(t, checkPorts([]int{1, 8080, 65535}))
	for _, bad := range [][]int{{0}, {-1}, {65536}, {8080, 8080}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
		assert.Error(t, checkPorts(bad), "%v", bad)
	}
}

func TestPortTokensAreFreshAndLong(t *testing.T) {
	a, err := portTokens([]int{80, 81})
	require.NoError(t, err)
	b, err := portTokens([]int{80})
	require.NoError(t, err)
	assert.NotEqual(t, a[80], a[81])
	assert.NotEqual(t, a[80], b[80])
	assert.Len(t, a[80], 43, "32 random bytes")
}

// A connection to a port is cut once it carried MaxPortBytes, both ways
// together.
func TestPortConnIsCutAtItsBytes(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	_, cancel := context.WithCancel(context.Background())
	c := &portConn{in: inW, out: outR, cancel: cancel}
	go func() { _, _ = io.Copy(io.Discard, inR) }()
	go func() {
		// 4 MiB more than the bound leaves after the write below.
		chunk := make([]byte, 1<<20)
		for i := 0; i < MaxPortBytes/2>>20+4; i++ {
			if _, err := outW.Write(chunk); err != nil {
				return
			}
		}
		outW.Close()
	}()
	// Half the bound one way, then the rest the other way.
	half := make([]byte, MaxPortBytes/2)
	n, err := c.Write(half)
	require.NoError(t, err)
	assert.Equal(t, len(half), n)
	read, err := io.Copy(io.Discard, c)
	assert.ErrorIs(t, err, ErrPortBytes)
	assert.LessOrEqual(t, read, int64(MaxPortBytes/2)+1<<20)
	_, err = c.Write([]byte("more"))
	assert.Error(t, err, "a cut connection takes no more")
}
