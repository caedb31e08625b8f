package kubernetes

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("disk full")
}

func TestKeepWriterNeverFailsTheStream(t *testing.T) {
	fw := &failingWriter{}
	k := &keepWriter{w: fw}
	for range 3 {
		n, err := k.Write([]byte("abc"))
		require.NoError(t, err, "the attach session must keep reading")
		assert.Equal(t, 3, n)
	}
	assert.Equal(t, 1, fw.n, "a failed writer is not called again")
	require.Error(t, k.Err())
	assert.NoError(t, (&keepWriter{w: &failingWriter{}}).Err())
}
