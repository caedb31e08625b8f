package faults

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// postgresDown is how long the PostgreSQL case stops the database: the
// trial's 30 s.
const postgresDown = 30 * time.Second

// privatePostgres starts a PostgreSQL cluster of the test's own, which it
// may stop and start; it skips without PostgreSQL unless
// TASKRUN_REQUIRE_POSTGRES is set.
func privatePostgres(t *testing.T) *pgtest.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(2*time.Minute))
	defer cancel()
	c, err := pgtest.Start(ctx)
	if errors.Is(err, pgtest.ErrNoPostgres) && os.Getenv(pgtest.EnvRequire) != "1" {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	return c
}

// PostgreSQL stopped for 30 s under `taskrun serve` while a worker's run
// streams: the control plane cannot acknowledge output or take a report
// meanwhile. The run must never end SUCCEEDED with output missing: when it
// is SUCCEEDED its stream holds every line and is ended; when it is FAILED
// the reason says why and the stream holds a whole prefix of the output
// (the bytes acknowledged). Either way the store's output.log holds every
// line. It fails if a report got through before the output it covers (the
// trial's SUCCEEDED with output missing), or if the run never ends.
func TestPostgresStoppedMidRunNeverSucceedsWithOutputMissing(t *testing.T) {
	e := newEnv(t)
	pg := privatePostgres(t)
	cp := newControlPlane(t, e, pg.NewDatabase(t), testdeadline.Scale(2*time.Minute))
	ctx := context.Background()
	const lines = 1000 // at least 20 s of printing: it goes on while the database is down
	resp, err := cp.user(t).Submit(ctx, controlplane.SubmitRequest{
		Prompt: "print", Image: testImage, Runtime: "runc",
		Command: printer(lines),
		Limits:  workerclient.Limits{MemoryBytes: 128 << 20, TimeoutMillis: 300000},
	}, nil)
	require.NoError(t, err)
	w := cp.startWorker(t, 1)
	require.Eventually(t, func() bool {
		r, err := cp.user(t).GetRun(ctx, resp.RunID)
		return err == nil && r.StreamNext > 100
	}, testdeadline.Scale(2*time.Minute), 20*time.Millisecond, "the run never streamed: %s", &w.stderr)

	hctx, cancel := context.WithTimeout(ctx, testdeadline.Scale(time.Minute))
	defer cancel()
	require.NoError(t, pg.Halt(hctx))
	time.Sleep(postgresDown) // the fault itself: the database is away this long
	require.NoError(t, pg.Resume(hctx))

	wctx, cancel2 := context.WithTimeout(ctx, testdeadline.Scale(5*time.Minute))
	defer cancel2()
	var r controlplane.Run
	require.Eventually(t, func() bool {
		r, err = cp.user(t).GetRun(wctx, resp.RunID)
		return err == nil && r.Status.Terminal()
	}, testdeadline.Scale(5*time.Minute), 100*time.Millisecond, "the run did not end: %s", &w.stderr)
	rc, err := cp.user(t).Output(ctx, resp.RunID, 0, false)
	require.NoError(t, err)
	streamed, err := io.ReadAll(rc)
	rc.Close()
	require.NoError(t, err)
	n := 0
	if len(streamed) > 0 {
		n = requireNumberedLines(t, string(streamed))
	}
	t.Logf("run %s: %s %q, %d lines streamed, stream ended %v", resp.RunID, r.Status, r.Error, n, r.StreamEnded)
	switch r.Status {
	case model.StatusSucceeded:
		assert.Equal(t, lines, n, "SUCCEEDED with output missing from the control plane's stream")
		assert.True(t, r.StreamEnded, "SUCCEEDED with the output stream not ended")
	case model.StatusFailed:
		assert.NotEmpty(t, r.Error, "FAILED without a reason")
	default:
		t.Fatalf("the run ended %s: %s", r.Status, r.Error)
	}
	stored := e.outputLogOf(t, r.Task.ConversationID, r.Task.ID, resp.RunID)
	assert.Equal(t, lines, requireNumberedLines(t, stored), "the store's output.log lacks lines")
}
