package persist_test

import (
	"context"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/persist"
)

// TestCoreLinksNoS3SDK checks that package persist itself imports neither
// the AWS SDK nor gocloud (whose blob package brings gRPC and Google's API
// client): only programs that import the persist/s3 driver link them.
func TestCoreLinksNoS3SDK(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the package's dependencies")
	}
	out, err := exec.Command(gotool, "list", "-deps", "github.com/taskrun/taskrun/persist").Output()
	require.NoError(t, err)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/taskrun/taskrun/model", "the listing should hold the package's dependencies")
	for _, p := range deps {
		assert.False(t, strings.HasPrefix(p, "github.com/aws/") || strings.HasPrefix(p, "gocloud.dev/") || strings.HasPrefix(p, "google.golang.org/grpc"),
			"package persist imports %s: move it behind the persist/s3 driver", p)
	}
}

// TestRegisterScheme opens a store through a registered driver.
func TestRegisterScheme(t *testing.T) {
	var opened *url.URL
	persist.RegisterScheme("testdriver", func(_ context.Context, u *url.URL) (persist.Bucket, error) {
		opened = u
		return persist.NewMemBucket(), nil
	})
	s, err := persist.Open(t.Context(), "testdriver://bucket?opt=1")
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NotNil(t, opened)
	assert.Equal(t, "bucket", opened.Host)
	assert.Equal(t, "1", opened.Query().Get("opt"))

	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	_, err = s.PutRunFile(t.Context(), ref, "output.log", strings.NewReader("hello"), "text/plain")
	require.NoError(t, err)

	assert.Panics(t, func() {
		persist.RegisterScheme("testdriver", func(context.Context, *url.URL) (persist.Bucket, error) { return nil, nil })
	}, "a scheme registered twice")
	assert.Panics(t, func() {
		persist.RegisterScheme("file", func(context.Context, *url.URL) (persist.Bucket, error) { return nil, nil })
	}, "a built-in scheme")
}
