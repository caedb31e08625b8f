package workerclient_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

func TestTerminalUpdaterWritesOneLinePerPatch(t *testing.T) {
	var buf bytes.Buffer
	u := workerclient.NewTerminalUpdater(&buf)

	require.NoError(t, u.UpdateRunStatus(t.Context(), "run-1", &workerclient.PatchTaskRunRequest{Status: model.StatusRunning}))
	require.NoError(t, u.UpdateRunStatus(t.Context(), "run-1", succeeded()))
	assert.ErrorIs(t, u.UpdateRunStatus(t.Context(), "../x", succeeded()), workerclient.ErrInvalidTaskRunID)

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 2)
	assert.Equal(t, `PATCH /v1/task-runs/run-1 {"status":"RUNNING"}`, lines[0])
	body, ok := strings.CutPrefix(lines[1], "PATCH /v1/task-runs/run-1 ")
	require.True(t, ok)
	var got workerclient.PatchTaskRunRequest
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	assert.Equal(t, *succeeded(), got)
}

func TestWriterStreamSenderWritesBytesOnceAndRefusesGaps(t *testing.T) {
	var buf bytes.Buffer
	s := workerclient.NewWriterStreamSender(&buf)
	ctx := t.Context()

	require.NoError(t, s.Send(ctx, "r", workerclient.Delta{Offset: 0, Data: []byte("hello ")}))
	require.NoError(t, s.Send(ctx, "r", workerclient.Delta{Offset: 3, Data: []byte("lo world")}), "overlap is skipped")
	require.NoError(t, s.Send(ctx, "r", workerclient.Delta{Offset: 0, Data: []byte("he")}), "full duplicate is dropped")
	assert.ErrorIs(t, s.Send(ctx, "r", workerclient.Delta{Offset: 20, Data: []byte("!")}), workerclient.ErrStreamGap)
	assert.ErrorIs(t, s.End(ctx, "r", 99), workerclient.ErrStreamGap)
	require.NoError(t, s.End(ctx, "r", 11))

	assert.Equal(t, "hello world", buf.String())
}
