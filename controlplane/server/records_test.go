package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workspace"
)

const (
	testPatch   = "diff --git a/main.go b/main.go\n--- a/main.go\n+++ b/main.go\n@@ -1 +1 @@\n-package old\n+package main\n"
	testChanges = `{"summary":{"files":1,"modified":1}}`
	testReport  = "# report\nall done\n"
)

// storedRun submits a task as the env's user (with a workspace upload) and
// stores, for its run, what a worker stores when the run ends: a patch, a
// change list, an artifact, a session state holding home/notes.txt, and the
// index record listing them.
func storedRun(t *testing.T, e *env) (runindex.Record, persist.RunRef) {
	t.Helper()
	ctx := context.Background()
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "change it"}, bytes.NewReader(tarGz(t, map[string]string{"main.go": "package old\n"})))
	require.NoError(t, err)
	ref := persist.RunRef{UserID: "alice", ConversationID: server.DefaultConversation, TaskID: sub.TaskID, RunID: sub.RunID}
	rec := runindex.Record{RunID: sub.RunID, UserID: ref.UserID, ConversationID: ref.ConversationID, TaskID: ref.TaskID,
		Status: model.StatusSucceeded, Start: time.Now().Add(-time.Minute), End: time.Now(), Isolation: "30 passed, 0 failed, 2 not applicable"}
	put := func(name, body string) persist.ObjectInfo {
		info, err := e.blobs.PutRunFile(ctx, ref, name, strings.NewReader(body), "application/octet-stream")
		require.NoError(t, err)
		rec.Stored = append(rec.Stored, info)
		return info
	}
	rec.Keys.Patch = put("changes.patch", testPatch).Key
	rec.Keys.Changes = put("changes.json", testChanges).Key
	art, err := e.blobs.PutArtifact(ctx, ref, "report.md", strings.NewReader(testReport), "text/markdown")
	require.NoError(t, err)
	rec.Stored = append(rec.Stored, art)
	home := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(home, "notes.txt"), []byte("from the home\n"), 0o644))
	var state bytes.Buffer
	_, err = workspace.PackHome(ctx, home, &state, workspace.PackOptions{})
	require.NoError(t, err)
	rec.Keys.State = put("session.tar.gz", state.String()).Key
	_, err = runindex.Put(ctx, e.blobs, &rec)
	require.NoError(t, err)
	return rec, ref
}

func readAll(t *testing.T, rc io.ReadCloser, err error) string {
	t.Helper()
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(b)
}

// TestRecordRoutes: a run's owner reads its stored record, patch, change
// list and files through the user API, as the local store serves them.
func TestRecordRoutes(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	rec, _ := storedRun(t, e)

	raw, err := e.user.Record(ctx, rec.RunID)
	require.NoError(t, err)
	var got runindex.Record
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Equal(t, rec.RunID, got.RunID)
	assert.Equal(t, rec.Isolation, got.Isolation)
	assert.Equal(t, rec.Keys, got.Keys)

	rc, err := e.user.OpenPatch(ctx, rec.RunID)
	assert.Equal(t, testPatch, readAll(t, rc, err))
	rc, err = e.user.OpenChanges(ctx, rec.RunID)
	assert.Equal(t, testChanges, readAll(t, rc, err))
	rc, err = e.user.OpenFile(ctx, rec.RunID, "artifacts/report.md")
	assert.Equal(t, testReport, readAll(t, rc, err))
	rc, err = e.user.OpenFile(ctx, rec.RunID, "home/notes.txt")
	assert.Equal(t, "from the home\n", readAll(t, rc, err))

	// A run whose worker stored nothing yet is answered 404, saying so.
	sub, err := e.user.Submit(ctx, controlplane.SubmitRequest{Prompt: "queued"}, nil)
	require.NoError(t, err)
	code, _, msg := getAs(t, e.url, "/v1/runs/"+sub.RunID+"/record", userToken)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, msg, "QUEUED")
	_, err = e.user.OpenFile(ctx, rec.RunID, "artifacts/missing.md")
	assertClientStatus(t, err, http.StatusNotFound)
}

// TestRecordRoutesTenantOnly: another tenant's run is not found on every
// record route, and a worker token opens none of them.
func TestRecordRoutesTenantOnly(t *testing.T) {
	e := newEnv(t, nil, nil)
	rec, _ := storedRun(t, e)
	for _, p := range []string{"/record", "/patch", "/changes", "/files/artifacts/report.md", "/files/home/notes.txt", "/files/changes.patch"} {
		code, _, _ := getAs(t, e.url, "/v1/runs/"+rec.RunID+p, bobToken)
		assert.Equal(t, http.StatusNotFound, code, "bob reads %s of alice's run", p)
		code, _, _ = getAs(t, e.url, "/v1/runs/"+rec.RunID+p, workerToken)
		assert.Equal(t, http.StatusForbidden, code, "a worker reads %s", p)
		code, _, _ = getAs(t, e.url, "/v1/runs/"+rec.RunID+p, userToken)
		assert.Equal(t, http.StatusOK, code, "alice reads %s", p)
	}
}

// TestRecordFilePathIsHostile: a file path that climbs out of the run,
// is absolute, or names an object the run's record does not list (here the
// uploaded workspace, which the store holds in the run's prefix) is refused.
func TestRecordFilePathIsHostile(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	rec, ref := storedRun(t, e)
	// Another run of the same user, with an object of its own.
	other, otherRef := storedRun(t, e)
	_, err := e.blobs.PutRunFile(ctx, otherRef, "secret.txt", strings.NewReader("other run"), "text/plain")
	require.NoError(t, err)
	ws, err := e.blobs.OpenRunFile(ctx, ref, server.WorkspaceObject)
	require.NoError(t, err, "the upload is in the run's prefix")
	ws.Close()

	base := "/v1/runs/" + rec.RunID + "/files/"
	for _, c := range []struct {
		path string
		want int
	}{
		{"..%2F" + other.RunID + "%2Fsecret.txt", http.StatusBadRequest},
		{"..%2F..%2F..%2F..%2Fbob%2Fx", http.StatusBadRequest},
		{"artifacts%2F..%2F..%2F" + other.RunID + "%2Fchanges.patch", http.StatusBadRequest},
		{"%2Fetc%2Fpasswd", http.StatusBadRequest},
		{"artifacts%5C..%5Creport.md", http.StatusBadRequest},
		{"home%2F..%2F..%2Fsecret.txt", http.StatusBadRequest},
		{server.WorkspaceObject, http.StatusNotFound},
		{"index.json", http.StatusNotFound},
	} {
		code, _, msg := getAs(t, e.url, base+c.path, userToken)
		assert.Equal(t, c.want, code, "%s: %s", c.path, msg)
	}
}

// TestRecordFileSizeBound: an object over Limits.MaxFileBytes is refused
// before a byte of it is sent.
func TestRecordFileSizeBound(t *testing.T) {
	e := newEnv(t, nil, func(c *server.Config) { c.Limits.MaxFileBytes = int64(len(testChanges)) })
	rec, _ := storedRun(t, e)
	code, _, msg := getAs(t, e.url, "/v1/runs/"+rec.RunID+"/changes", userToken)
	assert.Equal(t, http.StatusOK, code, msg)
	code, _, msg = getAs(t, e.url, "/v1/runs/"+rec.RunID+"/patch", userToken)
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, msg)
	code, _, msg = getAs(t, e.url, "/v1/runs/"+rec.RunID+"/files/home/notes.txt", userToken)
	assert.Equal(t, http.StatusOK, code, msg)
	code, _, msg = getAs(t, e.url, "/v1/runs/"+rec.RunID+"/files/artifacts/report.md", userToken)
	assert.Equal(t, http.StatusOK, code, msg, "as long as the change list")
}
