package taskrun_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// streamingAgent prints 4 MiB of numbered lines over about two seconds, then
// delivers an artifact and a trace.
const streamingAgent = `
i=0
while [ $i -lt 40 ]; do
  head -c 104857 /dev/zero | tr '\0' "$((i % 10))"
  echo " chunk $i"
  i=$((i+1))
  [ $((i % 8)) -eq 0 ] && sleep 0.3
done
echo report > /taskrun/artifacts/report.txt
mkdir -p /taskrun/global/traces/$TASKRUN_SESSION_ID
echo '{"event":"done"}' > /taskrun/global/traces/$TASKRUN_SESSION_ID/rt_$TASKRUN_RUN_ID.jsonl
`

// runThroughControlPlane runs streamingAgent reporting to cp over HTTP.
func runThroughControlPlane(t *testing.T, h *harness, cp *controlplanetest.ControlPlane, runID string) *taskrun.Outcome {
	t.Helper()
	client := workerclient.New(cp.URL(), "secret-token", workerclient.WithAttemptTimeout(2*time.Second))
	in := h.input(nil, runID, "sh", "-c", streamingAgent)
	in.Updater = client
	in.StreamSender = client.Stream()
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	return out
}

// RunTask with an HTTP TaskRunUpdater and StreamSender: every stdout byte
// reaches the control plane exactly once and in order, and the final PATCH
// carries the status, trace path and artifact, whatever faults the control
// plane injects; the result equals the one with a healthy server.
func TestRunTaskThroughFaultyControlPlane(t *testing.T) {
	h := newHarness(t)

	healthy := controlplanetest.New(t, "secret-token")
	want := runThroughControlPlane(t, h, healthy, "healthy")
	wantStream, ended, total := healthy.Stream("healthy")
	require.True(t, ended)
	require.EqualValues(t, len(wantStream), total)
	require.Equal(t, want.Result.OutputStr, string(wantStream[:min(len(wantStream), taskrun.MaxResultOutputBytes)])+taskrun.TruncationMarker)

	faults := map[string][]controlplanetest.Fault{
		"5xx": controlplanetest.Repeat(3, controlplanetest.Fault{Endpoint: controlplanetest.AnyEndpoint, Status: 503}),
		"429": {{Endpoint: controlplanetest.PatchEndpoint, Status: 429, RetryAfter: "1"}},
		"resets": append(controlplanetest.Repeat(2, controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint}),
			controlplanetest.Repeat(2, controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint, Reset: true})...),
		"lost answers": controlplanetest.Repeat(2, controlplanetest.Fault{Endpoint: controlplanetest.StreamEndpoint, AfterCommit: true}),
		"stall":        {{Endpoint: controlplanetest.StreamEndpoint}, {Endpoint: controlplanetest.StreamEndpoint, Delay: 3 * time.Second}},
		"restart":      {{Endpoint: controlplanetest.StreamEndpoint}, {Endpoint: controlplanetest.StreamEndpoint, Restart: true, Delay: time.Second}},
	}
	i := 0
	for name, fs := range faults {
		t.Run(name, func(t *testing.T) {
			i++
			runID := "faulty" + strconv.Itoa(i)
			cp := controlplanetest.New(t, "secret-token")
			cp.InjectFaults(fs...)
			got := runThroughControlPlane(t, h, cp, runID)

			stream, ended, total := cp.Stream(runID)
			assert.True(t, ended, "the end marker arrived")
			assert.EqualValues(t, len(stream), total)
			assert.Equal(t, sha256.Sum256(wantStream), sha256.Sum256(stream), "every stdout byte exactly once, in order")
			assert.Empty(t, cp.Violations())
			assert.Zero(t, cp.PendingFaults(), "every injected fault was hit")

			patches := cp.Patches(runID)
			require.NotEmpty(t, patches)
			final := patches[len(patches)-1]
			assert.Equal(t, model.StatusSucceeded, final.Status)
			require.NotNil(t, final.TracePath)
			assert.Equal(t, "traces/s1/rt_"+runID+".jsonl", *final.TracePath)
			require.NotNil(t, final.Artifact)
			assert.EqualValues(t, len("report\n"), final.Artifact.Size)
			assert.True(t, bytes.HasSuffix([]byte(*final.Output), []byte(taskrun.TruncationMarker)))

			assert.Equal(t, want.Status, got.Status)
			assert.Equal(t, want.Result.OutputStr, got.Result.OutputStr, "same result as with a healthy server")
		})
	}
}
