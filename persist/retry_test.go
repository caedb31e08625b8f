package persist_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/persist/s3test"
)

// faultProxy sits between the store and a real S3 server and answers some
// object PUTs itself with an S3 error.
type faultProxy struct {
	mu       sync.Mutex
	failures int // PUTs still to fail; negative fails all
	status   int
	code     string
	puts     int
}

func (f *faultProxy) set(failures, status int, code string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures, f.status, f.code, f.puts = failures, status, code, 0
}

func (f *faultProxy) putCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.puts
}

// intercept reports whether it answered r itself.
func (f *faultProxy) intercept(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPut || !strings.Contains(r.URL.Path, "/tenants/") {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.puts++
	if f.failures == 0 {
		return false
	}
	f.failures--
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(f.status)
	fmt.Fprintf(w, "<Error><Code>%s</Code><Message>injected by test</Message></Error>", f.code)
	return true
}

// startFaultProxy starts a real S3 server behind a fault-injecting proxy and
// returns the proxy and a store URL that goes through it.
func startFaultProxy(t *testing.T) (*faultProxy, string) {
	srv := s3test.StartServer(t)
	target, err := url.Parse("http://" + srv.Addr)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	fp := &faultProxy{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fp.intercept(w, r) {
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(hs.Close)
	return fp, s3URLAt(strings.TrimPrefix(hs.URL, "http://"))
}

func TestRetryClassification(t *testing.T) {
	fp, u := startFaultProxy(t)
	s := openStore(t, u, persist.WithRetry(3, 10*time.Millisecond))
	ctx := context.Background()
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	content := []byte("run output")

	t.Run("TransientSeekableRecovers", func(t *testing.T) {
		// More failures in a row than one SDK call retries: only the store's
		// own retry of the re-readable source gets the object through.
		fp.set(4, http.StatusServiceUnavailable, "SlowDown")
		info, err := s.PutRunFile(ctx, ref, "a.log", bytes.NewReader(content), "text/plain")
		require.NoError(t, err)
		assert.Equal(t, 5, fp.putCount())
		rc, err := s.OpenRunFile(ctx, ref, "a.log")
		require.NoError(t, err)
		got, err := io.ReadAll(rc)
		require.NoError(t, err)
		require.NoError(t, rc.Close())
		assert.Equal(t, content, got)
		requireStatMatches(t, s, info)
	})

	t.Run("TransientStreamNotRetriedByStore", func(t *testing.T) {
		fp.set(4, http.StatusServiceUnavailable, "SlowDown")
		_, err := s.PutRunFile(ctx, ref, "b.log", streamOnlyReader{strings.NewReader(string(content))}, "text/plain")
		assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
		assert.Less(t, fp.putCount(), 5, "a one-pass stream was re-sent by the store")
		_, err = s.OpenRunFile(ctx, ref, "b.log")
		assert.ErrorIs(t, err, persist.ErrNotFound)
	})

	t.Run("PermanentNotRetried", func(t *testing.T) {
		fp.set(-1, http.StatusForbidden, "AccessDenied")
		_, err := s.PutRunFile(ctx, ref, "c.log", bytes.NewReader(content), "text/plain")
		require.Error(t, err)
		assert.NotErrorIs(t, err, persist.ErrStoreUnavailable)
		assert.Equal(t, 1, fp.putCount(), "a permanent error was retried")
	})

	t.Run("OutageBounded", func(t *testing.T) {
		fp.set(-1, http.StatusServiceUnavailable, "SlowDown")
		_, err := s.PutRunFile(ctx, ref, "d.log", bytes.NewReader(content), "text/plain")
		assert.ErrorIs(t, err, persist.ErrStoreUnavailable)
		assert.Greater(t, fp.putCount(), 3)
		assert.LessOrEqual(t, fp.putCount(), 9, "retries must be bounded: 3 store attempts of at most 3 requests")
	})
}

func requireStatMatches(t *testing.T, s *persist.Store, info persist.ObjectInfo) {
	t.Helper()
	st, err := s.Stat(context.Background(), info.Key)
	require.NoError(t, err)
	assert.Equal(t, info, st)
}

func TestOpenS3Parameters(t *testing.T) {
	s3test.SetCredentialEnv(t)
	base := "s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:1"
	ok := []string{
		base + "&use_path_style=true&disable_https=true",
		base + "&s3ForcePathStyle=true&ssetype=AES256",
	}
	for _, u := range ok {
		s, err := persist.Open(context.Background(), u)
		if assert.NoError(t, err, u) {
			assert.NoError(t, s.Close())
		}
	}
	for _, u := range []string{
		base + "&use_path_style=maybe",
		base + "&ssetype=rot13",
		base + "&no_such_param=1",
	} {
		_, err := persist.Open(context.Background(), u)
		assert.Error(t, err, u)
	}
}

// A store that never answers within the caller's deadline is reported as
// unavailable, not as a plain context error, so callers keep the local copy.
func TestHangingStoreIsUnavailableAtTheDeadline(t *testing.T) {
	s3test.SetCredentialEnv(t)
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); hang.Close() })
	st, err := persist.Open(context.Background(), s3URLAt(strings.TrimPrefix(hang.URL, "http://")))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = st.PutRunFile(ctx, persist.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r"}, "output.log", strings.NewReader("x"), "text/plain")
	require.ErrorIs(t, err, persist.ErrStoreUnavailable)
}
