package s3_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob/fileblob"

	"github.com/taskrun/taskrun/persist"
)

// A file:// store written by gocloud's fileblob, as stores were before the
// store had its own file bucket, reads back the same through persist.Open,
// and one persist writes reads back through fileblob: objects, content
// types, digests and escaped names alike. (The test sits with the driver
// that links gocloud anyway, so the core module does not need it.)
func TestFileStoreLayoutIsFileblobs(t *testing.T) {
	ctx := context.Background()
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	names := []string{"plain.txt", "dir/sub/x.bin", "__0x41__/__0x2f__.txt", "a__0x2f", "sp ace/ü.md"}

	dir := t.TempDir()
	st, err := persist.Open(ctx, "file://"+dir)
	require.NoError(t, err)
	for _, n := range names {
		_, err := st.PutArtifact(ctx, ref, n, bytes.NewReader([]byte("ours "+n)), "text/plain")
		require.NoError(t, err, n)
	}
	require.NoError(t, st.Close())
	fb, err := fileblob.OpenBucket(dir, nil)
	require.NoError(t, err)
	defer fb.Close()
	for _, n := range names {
		key, err := persist.ArtifactKey(ref, n)
		require.NoError(t, err)
		data, err := fb.ReadAll(ctx, key)
		require.NoError(t, err, "fileblob reads %s", n)
		assert.Equal(t, "ours "+n, string(data))
		attrs, err := fb.Attributes(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, "text/plain", attrs.ContentType)
		assert.NotEmpty(t, attrs.Metadata["sha256"])
	}

	dir2 := t.TempDir()
	fb2, err := fileblob.OpenBucket(dir2, nil)
	require.NoError(t, err)
	defer fb2.Close()
	want := map[string]string{}
	for _, n := range names {
		key, err := persist.ArtifactKey(ref, n)
		require.NoError(t, err)
		want[key] = "theirs " + n
		w, err := fb2.NewWriter(ctx, key, nil)
		require.NoError(t, err)
		_, err = io.WriteString(w, want[key])
		require.NoError(t, err)
		require.NoError(t, w.Close())
	}
	st2, err := persist.Open(ctx, "file://"+dir2)
	require.NoError(t, err)
	defer st2.Close()
	prefix, err := persist.RunPrefix(ref)
	require.NoError(t, err)
	keys, err := st2.List(ctx, prefix)
	require.NoError(t, err)
	assert.Len(t, keys, len(names), "the listing unescapes fileblob's names")
	for _, k := range keys {
		rc, err := st2.Open(ctx, k)
		require.NoError(t, err, k)
		data, err := io.ReadAll(rc)
		require.NoError(t, err)
		_ = rc.Close()
		assert.Equal(t, want[k], string(data))
	}
}
