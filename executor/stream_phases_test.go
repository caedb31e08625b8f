package executor_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// streamInput is a run printing 1000 lines, reporting to and streaming to
// cp through a client that does not retry: the first refused POST stops
// the live stream.
func streamInput(u *unit, cp *controlplanetest.ControlPlane, token, runID string) executor.Input {
	in := u.input(runID, func(_ context.Context, p *sandboxfake.Process) int {
		for i := range 1000 {
			write(p.Stdout, fmt.Sprintf("line %d\n", i))
		}
		return 0
	})
	c := workerclient.New(cp.URL(), token, workerclient.WithRetryPolicy(workerclient.RetryPolicy{MaxAttempts: 1}))
	in.Updater, in.StreamSender = c, c.Stream()
	return in
}

func wantLines() string {
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// When the live stream gave up, the run's end delivers the rest before the
// terminal report: the control plane holds the whole output, ended.
func TestPhasesStreamThatGaveUpIsFinishedBeforeTheReport(t *testing.T) {
	u := newUnit(t)
	const token = "stream-token"
	cp := controlplanetest.New(t, token)
	cp.InjectFaults(controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint, Status: http.StatusInternalServerError})
	out, err := executor.Execute(context.Background(), streamInput(u, cp, token, "gaveup1"))
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	assert.Zero(t, cp.PendingFaults(), "the live stream met the fault")
	data, ended, total := cp.Stream("gaveup1")
	assert.Equal(t, wantLines(), string(data))
	assert.True(t, ended, "the stream was ended")
	assert.Equal(t, int64(len(wantLines())), total)
	patches := cp.Patches("gaveup1")
	require.NotEmpty(t, patches)
	assert.Equal(t, model.StatusSucceeded, patches[len(patches)-1].Status)
}

// When the control plane never takes the output, the run is not reported
// SUCCEEDED: FAILED, with the bytes acknowledged and the reason.
func TestPhasesUndeliveredOutputIsNeverSucceeded(t *testing.T) {
	u := newUnit(t)
	const token = "stream-token"
	cp := controlplanetest.New(t, token)
	cp.InjectFaults(controlplanetest.Repeat(1000, controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint, Status: http.StatusInternalServerError})...)
	start := time.Now()
	out, err := executor.Execute(context.Background(), streamInput(u, cp, token, "lost1"))
	require.Error(t, err)
	t.Logf("took %s", time.Since(start))
	assert.ErrorIs(t, err, executor.ErrOutputNotDelivered)
	assert.Equal(t, model.StatusFailed, out.Status)
	assert.Contains(t, out.Reason, "acknowledged 0 of the 8890 stdout bytes")
	patches := cp.Patches("lost1")
	require.NotEmpty(t, patches)
	final := patches[len(patches)-1]
	assert.Equal(t, model.StatusFailed, final.Status)
	require.NotNil(t, final.Error)
	assert.Contains(t, *final.Error, "output not delivered to the control plane")
	assert.Equal(t, wantLines(), u.runFile(t, "lost1", executor.OutputLogName), "the store holds it all")
}
