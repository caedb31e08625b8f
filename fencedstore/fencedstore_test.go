package fencedstore_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/fencedstore"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workerclient"
)

// The fenced store is a run index writer: the pipeline writes a leased
// run's index record through it, so the run is listed like a local one.
var _ runindex.Writer = (*fencedstore.Store)(nil)

func openStore(t *testing.T) *persist.Store {
	t.Helper()
	st, err := persist.Open(context.Background(), "file://"+filepath.Join(t.TempDir(), "store"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// A confirmed lease lets the index record through; once the lease is lost
// neither the index nor any other object is written again.
func TestIndexRecordIsWrittenWhileTheLeaseHoldsAndDroppedOnceLost(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	var lease error
	fs := fencedstore.New(st, st, func(context.Context) error { return lease }, nil)
	start := time.Now().UTC().Truncate(time.Millisecond)
	rec := &runindex.Record{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1", Start: start, Status: "RUNNING"}

	_, err := runindex.Put(ctx, fs, rec)
	require.NoError(t, err)
	got, err := runindex.Find(ctx, st, "r1", "u1")
	require.NoError(t, err)
	assert.Equal(t, "RUNNING", string(got.Status))

	lease = fmt.Errorf("renew: %w", workerclient.ErrLeaseLost)
	rec.Status = "SUCCEEDED"
	_, err = runindex.Put(ctx, fs, rec)
	require.NoError(t, err, "a lost lease drops the write without an error")
	_, err = fs.PutRunFile(ctx, rec.Ref(), "output.log", strings.NewReader("late"), "text/plain")
	require.NoError(t, err)
	got, err = runindex.Find(ctx, st, "r1", "u1")
	require.NoError(t, err)
	assert.Equal(t, "RUNNING", string(got.Status), "the record is not rewritten after the lease is lost")
	assert.EqualValues(t, 2, fs.Dropped())
}

// When the control plane cannot tell, the index write fails: it is never
// written unfenced.
func TestIndexWriteFailsWhenTheLeaseCannotBeConfirmed(t *testing.T) {
	st := openStore(t)
	down := errors.New("control plane answered 503")
	fs := fencedstore.New(st, st, func(context.Context) error { return down }, nil)
	_, err := runindex.Put(context.Background(), fs, &runindex.Record{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "r1", Start: time.Now()})
	require.ErrorIs(t, err, down)
	_, err = runindex.Find(context.Background(), st, "r1", "u1")
	assert.Error(t, err, "nothing was written")
}
