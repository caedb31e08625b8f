package webui_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/webui"
	"github.com/taskrun/taskrun/workerclient"
)

// The hosts page of a control plane shows each worker's last heartbeat:
// slots, free capacity, runtimes, and the leases it holds (only the
// tenant's); a lease holder with no heartbeat on record is marked so.
func TestHostsPageShowsHeartbeats(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	now := time.Now().UTC().Truncate(time.Millisecond)
	require.NoError(t, store.RecordWorker(ctx, controlplane.Worker{ID: "host-a/1", LastSeen: now.Add(-time.Minute),
		Capacity: workerclient.Capacity{Slots: 4, FreeSlots: 3, FreeMemoryBytes: 3 << 30, FreeDiskBytes: 40 << 30},
		Labels:   workerclient.WorkerLabels{Runtimes: []string{"runc", "runsc"}, Backend: "docker"}}))
	require.NoError(t, store.RecordWorker(ctx, controlplane.Worker{ID: "host-old/1", LastSeen: now.Add(-2 * controlplane.WorkerListWindow)}))
	for i, id := range []string{"mine", "theirs"} {
		user := map[int]string{0: "alice", 1: "bob"}[i]
		_, err := store.CreateTask(ctx, controlplane.NewTask{Task: model.Task{ID: "t-" + id, UserID: user, ConversationID: "c", Prompt: "p"},
			RunID: id, SessionID: "s", CreatedAt: now.Add(time.Duration(i) * time.Second)})
		require.NoError(t, err)
	}
	for _, w := range []string{"host-a/1", "host-silent/1"} {
		r, err := store.Lease(ctx, controlplane.LeaseOffer{Holder: w, TokenHash: sha256.Sum256([]byte(w)), WorkerID: w, Now: now, TTL: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, r)
	}

	src := &webui.ControlPlaneSource{Control: store, Workers: store, Now: func() time.Time { return now }}
	hosts, err := src.Hosts(ctx)
	require.NoError(t, err)
	require.Len(t, hosts, 2, "the worker silent for longer than the window is left out")
	a, silent := hosts[0], hosts[1]
	assert.Equal(t, "host-a/1", a.ID)
	assert.True(t, a.Reported)
	assert.Equal(t, 4, a.Slots)
	assert.Equal(t, 3, a.FreeSlots)
	assert.Equal(t, int64(40<<30), a.FreeDiskBytes)
	assert.True(t, now.Add(-time.Minute).Equal(a.LastHeartbeat))
	assert.Equal(t, "runc,runsc", a.Labels["runtimes"])
	assert.Equal(t, []webui.Lease{{RunID: "mine", Tenant: "alice"}}, a.Leases)
	assert.Equal(t, "host-silent/1", silent.ID)
	assert.False(t, silent.Reported, "no heartbeat on record")
	assert.Len(t, silent.Leases, 1)

	h, err := webui.New(src, webui.Options{Base: "/ui", Tenant: func(r *http.Request) (string, bool) { return "alice", true }})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, body := get(t, srv.URL+"/ui/hosts")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "3 / 4", "free and total slots")
	assert.Contains(t, body, "3.0 GiB / 40.0 GiB", "free memory and disk")
	assert.Contains(t, body, "runtimes=runc,runsc")
	assert.Contains(t, body, now.Add(-time.Minute).Format("2006-01-02 15:04:05Z"), "the last heartbeat")
	assert.Contains(t, body, "/ui/runs/mine", "the tenant's lease")
	assert.NotContains(t, body, "theirs", "another tenant's lease is not shown")
	assert.Contains(t, body, "no heartbeat on record", "the silent lease holder is marked")
}
