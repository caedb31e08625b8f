package persist_test

import (
	"context"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/persist/persisttest"
	"github.com/taskrun/taskrun/persist/s3test"
)

// openStore opens rawURL and closes the store when t ends.
func openStore(t *testing.T, rawURL string, opts ...persist.Option) *persist.Store {
	t.Helper()
	s, err := persist.Open(context.Background(), rawURL, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func TestConformanceFile(t *testing.T) {
	persisttest.RunConformance(t, func(t *testing.T) *persist.Store {
		return openStore(t, "file://"+filepath.Join(t.TempDir(), "store"))
	})
}

func TestConformanceMem(t *testing.T) {
	persisttest.RunConformance(t, func(t *testing.T) *persist.Store {
		return openStore(t, "mem://")
	})
}

func TestConformanceS3(t *testing.T) {
	u := s3test.Start(t)
	persisttest.RunConformance(t, func(t *testing.T) *persist.Store {
		return openStore(t, u)
	})
}

func TestOpenUnsupportedScheme(t *testing.T) {
	for _, u := range []string{"ftp://host/dir", "/plain/path", "http://example.invalid/b"} {
		_, err := persist.Open(context.Background(), u)
		require.Error(t, err, u)
		for _, scheme := range []string{"file://", "mem://", "s3://"} {
			assert.Contains(t, err.Error(), scheme, "error for %s should name the supported schemes", u)
		}
	}
}

// Google Cloud Storage and Azure Blob Storage URLs are refused with the way
// to reach them.
func TestOpenDroppedSchemeNamesTheWay(t *testing.T) {
	_, err := persist.Open(context.Background(), "gs://bucket")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "endpoint=https://storage.googleapis.com")
	_, err = persist.Open(context.Background(), "azblob://container")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "S3-compatible gateway")
}

func TestOpenFileRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, u := range []string{
		"file://" + dir + "?metadata=skip",
		"file://",
		"file://otherhost/dir",
	} {
		_, err := persist.Open(context.Background(), u)
		assert.Error(t, err, u)
	}
}

// TestOpenRelativeFileURL checks that file://./rel resolves against the working
// directory at Open time and that the directory is created.
func TestOpenRelativeFileURL(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	s := openStore(t, "file://./.taskrun/store")
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	info, err := s.PutRunFile(context.Background(), ref, "output.log", strings.NewReader("hello"), "text/plain")
	require.NoError(t, err)

	got, err := os.ReadFile(filepath.Join(wd, ".taskrun", "store", filepath.FromSlash(info.Key)))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	st, err := os.Stat(filepath.Join(wd, ".taskrun", "store"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "store directory must be private to the executor")
}

func TestPingFile(t *testing.T) {
	s := openStore(t, "file://"+t.TempDir())
	require.NoError(t, s.Ping(context.Background()))
}

// s3URLAt is a store URL for an S3 endpoint at addr.
func s3URLAt(addr string) string {
	q := url.Values{"endpoint": {"http://" + addr}, "region": {s3test.Region}, "use_path_style": {"true"}}
	return "s3://" + s3test.Bucket + "?" + q.Encode()
}

// TestStoreDownUnreachableEndpoint needs no S3 server: nothing listens on the
// endpoint, so every operation must fail as unavailable after bounded retries.
func TestStoreDownUnreachableEndpoint(t *testing.T) {
	s3test.SetCredentialEnv(t)
	s := openStore(t, s3URLAt(s3test.ClosedAddr(t)), persist.WithRetry(2, 10*time.Millisecond))
	ctx := context.Background()
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}

	_, err := s.PutRunFile(ctx, ref, "output.log", strings.NewReader("partial output"), "text/plain")
	assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
	_, err = s.PutArtifact(ctx, ref, "a.txt", streamOnlyReader{strings.NewReader("x")}, "text/plain")
	assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
	_, err = s.OpenRunFile(ctx, ref, "output.log")
	assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
	assert.NotErrorIs(t, err, persist.ErrNotFound)
	assert.ErrorIs(t, s.Ping(ctx), persist.ErrStoreUnavailable)
}

// TestStoreDownServerStopped stops a real S3 server under a working store.
func TestStoreDownServerStopped(t *testing.T) {
	srv := s3test.StartServer(t)
	s := openStore(t, srv.URL, persist.WithRetry(2, 10*time.Millisecond))
	ctx := context.Background()
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	require.NoError(t, s.Ping(ctx))
	_, err := s.PutRunFile(ctx, ref, "output.log", strings.NewReader("first"), "text/plain")
	require.NoError(t, err)

	srv.Stop()
	local := strings.NewReader("second")
	_, err = s.PutRunFile(ctx, ref, "output.log", local, "text/plain")
	assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
	_, err = s.OpenRunFile(ctx, ref, "output.log")
	assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
}

// TestCanceledContextIsNotUnavailable checks that a caller's cancellation is
// reported as such, not as a store outage.
func TestCanceledContextIsNotUnavailable(t *testing.T) {
	s := openStore(t, "mem://")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	_, err := s.PutRunFile(ctx, ref, "output.log", strings.NewReader("x"), "text/plain")
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, persist.ErrStoreUnavailable)
}

// streamOnlyReader hides any Seek method of r, making it a one-pass stream.
type streamOnlyReader struct{ r io.Reader }

func (s streamOnlyReader) Read(p []byte) (int, error) { return s.r.Read(p) }

// On the file store, an object where another one's directory is (and the
// reverse) is refused as ErrKeyRejected at once, not retried and never
// reported as an unavailable store, so a caller can skip that object and a
// retry of the rest succeeds.
//
// Without the classification, both puts fail with ErrStoreUnavailable after
// every retry, and a run's persist could never succeed.
func TestFileStoreRejectsConflictingKeysDefinitely(t *testing.T) {
	s := openStore(t, "file://"+filepath.Join(t.TempDir(), "store"), persist.WithRetry(5, time.Hour))
	ctx := context.Background()
	for _, tc := range []struct{ first, second string }{
		{"traces/s1/x", "traces/s1/x/y"},
		{"traces/s1/d/y/z", "traces/s1/d/y"},
	} {
		_, err := s.PutGlobalFile(ctx, "u1", tc.first, strings.NewReader("first"), "")
		require.NoError(t, err)
		// A retry would sleep an hour: returning at all shows none happened.
		_, err = s.PutGlobalFile(ctx, "u1", tc.second, strings.NewReader("second"), "")
		require.ErrorIs(t, err, persist.ErrKeyRejected, tc.second)
		assert.NotErrorIs(t, err, persist.ErrStoreUnavailable)
		_, err = s.PutGlobalFile(ctx, "u1", tc.first+"-sibling", strings.NewReader("other"), "")
		require.NoError(t, err, "the store still takes other keys")
	}
}
