package controlplanetest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

func TestRecorderKeepsPatchesAndAContiguousStream(t *testing.T) {
	ctx := context.Background()
	var r controlplanetest.Recorder
	_, ok := r.Last()
	assert.False(t, ok)

	require.NoError(t, r.UpdateRunStatus(ctx, "r1", &workerclient.PatchTaskRunRequest{Status: model.StatusRunning}))
	require.NoError(t, r.Send(ctx, "r1", workerclient.Delta{Offset: 0, Data: []byte("ab")}))
	require.Error(t, r.Send(ctx, "r1", workerclient.Delta{Offset: 5, Data: []byte("x")}), "a gap is refused")
	require.Error(t, r.Send(ctx, "r1", workerclient.Delta{Offset: 0, Data: []byte("ab")}), "a resend is refused")
	require.NoError(t, r.Send(ctx, "r1", workerclient.Delta{Offset: 2, Data: []byte("c")}))
	require.Error(t, r.End(ctx, "r1", 4), "a wrong total is refused")
	require.NoError(t, r.End(ctx, "r1", 3))
	require.NoError(t, r.UpdateRunStatus(ctx, "r1", &workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded}))

	data, ended, total := r.Stream()
	assert.Equal(t, "abc", string(data))
	assert.True(t, ended)
	assert.EqualValues(t, 3, total)
	last, ok := r.Last()
	require.True(t, ok)
	assert.Equal(t, model.StatusSucceeded, last.Status)
	assert.Len(t, r.Patches(), 2)
}
