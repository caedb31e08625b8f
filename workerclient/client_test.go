package workerclient_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

const token = "s3cret-token"

// taskRunUpdater is the seed interface taskrun.TaskRunUpdater; Client and
// TerminalUpdater must satisfy it.
type taskRunUpdater interface {
	UpdateRunStatus(ctx context.Context, taskRunID string, req *workerclient.PatchTaskRunRequest) error
}

var (
	_ taskRunUpdater            = (*workerclient.Client)(nil)
	_ taskRunUpdater            = (*workerclient.TerminalUpdater)(nil)
	_ workerclient.StreamSender = (*workerclient.HTTPStreamSender)(nil)
	_ workerclient.StreamSender = (*workerclient.WriterStreamSender)(nil)
)

// fastRetries keeps tests quick while still exercising real waits.
var fastRetries = workerclient.RetryPolicy{
	MaxAttempts:    10,
	MaxElapsed:     time.Minute,
	InitialBackoff: 5 * time.Millisecond,
	MaxBackoff:     50 * time.Millisecond,
}

// sleepRecorder replaces the client's sleep: it records each wait and then
// waits for real, or returns at once when instant.
type sleepRecorder struct {
	instant bool
	mu      sync.Mutex
	waits   []time.Duration
}

func (s *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	if s.instant {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newClient returns a client with quiet logs and the given options.
func newClient(url, token string, opts ...workerclient.Option) *workerclient.Client {
	opts = append([]workerclient.Option{workerclient.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	return workerclient.New(url, token, opts...)
}

func (s *sleepRecorder) recorded() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}

func succeeded() *workerclient.PatchTaskRunRequest {
	ended, exit, pt, ct := int64(1_700_000_100_000), 0, 1200, 345
	out, trace := "done: 3 files changed", "users/u1/traces/s1/rt_a1.jsonl"
	return &workerclient.PatchTaskRunRequest{
		Status:           model.StatusSucceeded,
		EndedAt:          &ended,
		Output:           &out,
		ExitCode:         &exit,
		PromptTokens:     &pt,
		CompletionTokens: &ct,
		TracePath:        &trace,
		Artifact:         &workerclient.Artifact{Key: "users/u1/artifacts/r1/report.pdf", Size: 42, SHA256: strings.Repeat("ab", 32), ContentType: "application/pdf"},
		Container:        &workerclient.ContainerInfo{ID: "c0ffee", Runtime: "runsc"},
	}
}

func TestUpdateRunStatusSendsPatchWithBearerToken(t *testing.T) {
	cp := controlplanetest.New(t, token)
	c := newClient(cp.URL(), token)

	require.NoError(t, c.UpdateRunStatus(t.Context(), "run-1", succeeded()))

	assert.Equal(t, []workerclient.PatchTaskRunRequest{*succeeded()}, cp.Patches("run-1"))
	assert.Len(t, cp.Requests("run-1"), 1)
	assert.Zero(t, cp.AuthFailures())
}

func TestWrongTokenIsRejectedWithoutRetry(t *testing.T) {
	cp := controlplanetest.New(t, token)
	c := newClient(cp.URL(), "wrong", workerclient.WithRetryPolicy(fastRetries))

	err := c.UpdateRunStatus(t.Context(), "run-1", succeeded())

	var he *workerclient.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusUnauthorized, he.StatusCode)
	assert.ErrorIs(t, err, workerclient.ErrRejected)
	assert.Equal(t, 1, cp.AuthFailures())
	assert.Empty(t, cp.Patches("run-1"))
}

func TestUpdateRunStatusRetriesTransientFailures(t *testing.T) {
	cases := map[string][]controlplanetest.Fault{
		"5xx":                controlplanetest.Repeat(3, controlplanetest.Fault{Status: http.StatusServiceUnavailable}),
		"429":                {{Status: http.StatusTooManyRequests, RetryAfter: "1"}},
		"connection reset":   controlplanetest.Repeat(2, controlplanetest.Fault{Reset: true}),
		"answer lost":        {{AfterCommit: true, Reset: true}, {AfterCommit: true, Status: http.StatusBadGateway}},
		"stall past timeout": {{Delay: 2 * time.Second}},
		"restart":            {{Restart: true, Delay: 100 * time.Millisecond}},
	}
	for name, faults := range cases {
		t.Run(name, func(t *testing.T) {
			cp := controlplanetest.New(t, token)
			cp.InjectFaults(faults...)
			sleeps := &sleepRecorder{}
			c := newClient(cp.URL(), token,
				workerclient.WithRetryPolicy(fastRetries),
				workerclient.WithAttemptTimeout(500*time.Millisecond),
				workerclient.WithSleep(sleeps.sleep))

			require.NoError(t, c.UpdateRunStatus(t.Context(), "run-1", succeeded()))

			assert.Zero(t, cp.PendingFaults(), "every fault was hit")
			assert.Len(t, cp.Requests("run-1"), len(faults)+1, "one retry per fault")
			// A restart also refuses connections while down: those retries
			// never reach the server but are waited for too.
			assert.GreaterOrEqual(t, len(sleeps.recorded()), len(faults), "a wait before every retry")
			patches := cp.Patches("run-1")
			require.NotEmpty(t, patches)
			for _, p := range patches {
				assert.Equal(t, *succeeded(), p, "a repeated PATCH is identical, so idempotent")
			}
		})
	}
}

func TestUpdateRunStatusDoesNotRetryPermanentRejections(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			cp := controlplanetest.New(t, token)
			cp.InjectFaults(controlplanetest.Repeat(3, controlplanetest.Fault{Status: status})...)
			sleeps := &sleepRecorder{}
			c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(fastRetries), workerclient.WithSleep(sleeps.sleep))

			err := c.UpdateRunStatus(t.Context(), "run-1", succeeded())

			var he *workerclient.HTTPError
			require.ErrorAs(t, err, &he)
			assert.Equal(t, status, he.StatusCode)
			assert.Contains(t, he.Body, "injected fault")
			assert.ErrorIs(t, err, workerclient.ErrRejected)
			assert.Len(t, cp.Requests("run-1"), 1, "a permanent rejection is not retried")
			assert.Empty(t, sleeps.recorded())
			assert.Equal(t, 2, cp.PendingFaults())
		})
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := map[string]struct {
		header string
		want   time.Duration
	}{
		"seconds":   {"7", 7 * time.Second},
		"HTTP date": {now.Add(3 * time.Second).Format(http.TimeFormat), 3 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cp := controlplanetest.New(t, token)
			cp.InjectFaults(
				controlplanetest.Fault{Status: http.StatusTooManyRequests, RetryAfter: tc.header},
				controlplanetest.Fault{Status: http.StatusServiceUnavailable, RetryAfter: tc.header},
			)
			sleeps := &sleepRecorder{instant: true}
			c := newClient(cp.URL(), token,
				workerclient.WithRetryPolicy(fastRetries),
				workerclient.WithSleep(sleeps.sleep),
				workerclient.WithClock(func() time.Time { return now }))

			require.NoError(t, c.UpdateRunStatus(t.Context(), "run-1", succeeded()))
			assert.Equal(t, []time.Duration{tc.want, tc.want}, sleeps.recorded())
		})
	}
}

func TestBackoffIsJitteredAndExponential(t *testing.T) {
	cp := controlplanetest.New(t, token)
	cp.InjectFaults(controlplanetest.Repeat(6, controlplanetest.Fault{Status: http.StatusInternalServerError})...)
	sleeps := &sleepRecorder{instant: true}
	policy := workerclient.RetryPolicy{MaxAttempts: 10, MaxElapsed: time.Hour, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 800 * time.Millisecond}
	c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(policy), workerclient.WithSleep(sleeps.sleep))

	require.NoError(t, c.UpdateRunStatus(t.Context(), "run-1", succeeded()))

	ceilings := []time.Duration{100, 200, 400, 800, 800, 800}
	waits := sleeps.recorded()
	require.Len(t, waits, len(ceilings))
	for i, ceil := range ceilings {
		ceil *= time.Millisecond
		assert.GreaterOrEqual(t, waits[i], ceil/2, "wait %d", i)
		assert.LessOrEqual(t, waits[i], ceil, "wait %d", i)
	}
}

func TestRetriesStopAtMaxAttemptsAndContext(t *testing.T) {
	cp := controlplanetest.New(t, token)
	cp.InjectFaults(controlplanetest.Repeat(5, controlplanetest.Fault{Status: http.StatusBadGateway})...)
	sleeps := &sleepRecorder{}
	policy := fastRetries
	policy.MaxAttempts = 3
	c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(policy), workerclient.WithSleep(sleeps.sleep))

	err := c.UpdateRunStatus(t.Context(), "run-1", succeeded())
	var he *workerclient.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusBadGateway, he.StatusCode)
	assert.NotErrorIs(t, err, workerclient.ErrRejected, "a 5xx is not a permanent rejection")
	assert.Len(t, cp.Requests("run-1"), 3)

	// A cancelled context stops retrying: the wait returns the context's error.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = c.UpdateRunStatus(ctx, "run-2", succeeded())
	assert.ErrorIs(t, err, context.Canceled)
}

func TestMaxElapsedBoundsRetries(t *testing.T) {
	cp := controlplanetest.New(t, token)
	cp.InjectFaults(controlplanetest.Fault{Status: http.StatusServiceUnavailable, RetryAfter: "120"})
	sleeps := &sleepRecorder{}
	policy := fastRetries
	policy.MaxElapsed = time.Minute
	c := newClient(cp.URL(), token, workerclient.WithRetryPolicy(policy), workerclient.WithSleep(sleeps.sleep))

	err := c.UpdateRunStatus(t.Context(), "run-1", succeeded())
	var he *workerclient.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, 120*time.Second, he.RetryAfter)
	assert.Empty(t, sleeps.recorded(), "a wait past MaxElapsed is not started")
}

func TestInvalidTaskRunIDIsRefusedBeforeAnyRequest(t *testing.T) {
	cp := controlplanetest.New(t, token)
	c := newClient(cp.URL(), token)
	for _, id := range []string{"", "../admin", "a/b", "a b", "r%2F1", strings.Repeat("x", 129)} {
		err := c.UpdateRunStatus(t.Context(), id, succeeded())
		require.ErrorIs(t, err, workerclient.ErrInvalidTaskRunID, "id %q", id)
		assert.ErrorContains(t, err, "A-Z", "the error names the allowed characters")
		err = c.Stream().Send(t.Context(), id, workerclient.Delta{Data: []byte("x")})
		assert.ErrorIs(t, err, workerclient.ErrInvalidTaskRunID, "id %q", id)
		assert.Empty(t, cp.Requests(id))
	}
}

func TestBadBaseURLNamesTheFix(t *testing.T) {
	c := newClient("cp.example.com", token)
	err := c.UpdateRunStatus(t.Context(), "run-1", succeeded())
	require.Error(t, err)
	assert.ErrorContains(t, err, "https://")
}

func TestNetworkErrorsAreRetriedThenReported(t *testing.T) {
	sleeps := &sleepRecorder{}
	policy := fastRetries
	policy.MaxAttempts = 2
	// Nothing listens on port 1: every attempt is refused.
	c := newClient("http://127.0.0.1:1", token, workerclient.WithRetryPolicy(policy), workerclient.WithSleep(sleeps.sleep))

	err := c.UpdateRunStatus(t.Context(), "run-1", succeeded())
	require.Error(t, err)
	assert.False(t, errors.As(err, new(*workerclient.HTTPError)), "no HTTP answer was received")
	assert.NotErrorIs(t, err, workerclient.ErrRejected)
	assert.Len(t, sleeps.recorded(), 1, "the refused connection was retried once")
}
