package main

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/persist"
)

func TestMain(m *testing.M) {
	code := m.Run()
	closeTestRegistry()
	testbin.Cleanup()
	removeTaskrunBin()
	os.Exit(code)
}

func auditCmd(args ...string) (string, string, int) {
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), append([]string{"audit"}, args...), &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

// A run's stored isolation record re-checks clean from the store.
func TestAuditRechecksStoredRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real containers")
	}
	store := "file://" + t.TempDir()
	var stdout, stderr lockedbuf.Buffer
	code := dispatch(context.Background(), []string{
		"run", "--root", t.TempDir(), "--store", store, "--helpers-dir", testbin.Dir(t), "--gc=false", "--user", tenant(t),
		"--run-id", "audited1", "--image", testImage, "--json", "--", "true",
	}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())

	key, err := persist.RunKey(persist.RunRef{UserID: tenant(t), ConversationID: "cli", TaskID: "default", RunID: "audited1"}, taskrun.AuditRecordName)
	require.NoError(t, err)
	out, errOut, code := auditCmd("--store", store, "--record", key, "--json")
	require.Equal(t, 0, code, errOut)
	var reports []struct {
		Findings []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"findings"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &reports), out)
	require.Len(t, reports, 1)
	ids := map[string]string{}
	for _, f := range reports[0].Findings {
		ids[f.ID] = f.Status
	}
	assert.Equal(t, "PASS", ids["TR:probe"], "the in-sandbox self-check is part of the record")
	assert.Equal(t, "PASS", ids["5.5"])
}

// A privileged container fails the live audit with exit status 1.
func TestAuditFlagsPrivilegedContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("creates containers")
	}
	docker, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	defer docker.Close()
	ctx := context.Background()
	created, err := docker.ContainerCreate(ctx,
		&container.Config{Image: testImage, Cmd: []string{"true"}, Labels: map[string]string{"dev.taskrun.managed": "true", "dev.taskrun.tenant": tenant(t)}},
		&container.HostConfig{Privileged: true}, nil, nil, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = docker.ContainerRemove(ctx, created.ID, container.RemoveOptions{Force: true}) })

	out, errOut, code := auditCmd(created.ID)
	assert.Equal(t, 1, code, errOut)
	assert.Contains(t, out, "5.5")
	assert.Contains(t, out, "FAIL")
}

func TestAuditUsageErrors(t *testing.T) {
	_, errOut, code := auditCmd()
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--all")
	_, _, code = auditCmd("--record", "/no/such/audit.json")
	assert.Equal(t, 2, code)
}
