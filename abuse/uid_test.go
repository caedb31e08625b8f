package abuse_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/uidpool"
)

const inotifyHogPkg = "./internal/testbin/inotifyhog"

// inotifyStarvation runs A, which opens every inotify instance its uid may
// have and sleeps, then, while A holds them, B, which calls inotify_init once,
// and returns what A held and B printed. configure sets each run's uid.
func inotifyStarvation(t *testing.T, h *harness, configure func(*taskrun.RunTaskInput)) (held, tried string) {
	t.Helper()
	ws := t.TempDir()
	copyExecutable(t, testbin.Program(t, inotifyHogPkg), filepath.Join(ws, "inotifyhog"))

	inA, _ := h.input(t, "hog", "./inotifyhog hold")
	inA.Task.WorkspaceDir = ws
	configure(&inA)
	var outA lockedbuf.Buffer
	inA.Stdout = &outA
	ctx, cancel := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() {
		_, err := taskrun.Execute(ctx, inA)
		doneA <- err
	}()
	stopA := sync.OnceFunc(func() { cancel(); <-doneA })
	t.Cleanup(stopA)
	for !strings.Contains(outA.String(), "held ") {
		select {
		case err := <-doneA:
			doneA <- err
			require.FailNow(t, "run A ended before it held the instances", "%v: %q", err, outA.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	held = strings.TrimSpace(outA.String())

	inB, _ := h.input(t, "victim", "./inotifyhog try")
	inB.Task.WorkspaceDir = ws
	configure(&inB)
	out, err := taskrun.Execute(context.Background(), inB)
	require.NoError(t, err)
	require.Equal(t, model.StatusSucceeded, out.Status, out.Reason)
	stopA() // A's records are stored once it ended
	return held, strings.TrimSpace(out.Result.OutputStr)
}

// randomUser is a uid:gid pair from a range no other test uses.
func randomUser() string {
	uid := 270000 + rand.IntN(10000)
	return fmt.Sprintf("%d:%d", uid, uid)
}

// One run opening every inotify instance its uid may have
// (fs.inotify.max_user_instances, a per-user limit) does not stop another
// run's inotify_init when each run has a uid of its own.
//
// Protection: a host uid per live run (package uidpool). The control runs A
// and B as one uid, as every run was before, and B's inotify_init fails with
// EMFILE; so the test fails if runs share a uid.
func TestInotifyExhaustionStaysWithinItsRun(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	t.Run("own uids", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		// Two uids: A and B take both, and give both back when they end.
		first := 280000 + 2*rand.IntN(5000)
		pool, err := uidpool.New(t.TempDir(), uidpool.Range{First: first, Last: first + 1})
		require.NoError(t, err)
		held, tried := inotifyStarvation(t, h, func(in *taskrun.RunTaskInput) { in.UIDs = pool })
		recA, recB := h.record(t, "hog"), h.record(t, "victim")
		require.NotNil(t, recA.Probe)
		require.NotNil(t, recB.Probe)
		t.Logf("A (uid %d): %s; B (uid %d): %s", recA.Probe.UID, held, recB.Probe.UID, tried)
		assert.NotEqual(t, recA.Probe.UID, recB.Probe.UID, "each live run has a uid of its own")
		assert.ElementsMatch(t, []int{first, first + 1}, []int{recA.Probe.UID, recB.Probe.UID}, "the uids are the pool's")
		assert.Equal(t, fmt.Sprintf("%d:%d", recB.Probe.UID, recB.Probe.UID), recB.Posture.User, "the audit saw the leased user")
		assert.Regexp(t, `^held \d+ EMFILE$`, held, "A exhausted its uid's instances")
		assert.Equal(t, "inotify_init OK", tried)
		for range 2 {
			l, err := pool.Acquire(context.Background())
			require.NoError(t, err, "the ended runs released their uids")
			defer l.Release()
		}
	})
	t.Run("one shared uid (control)", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		shared := randomUser()
		held, tried := inotifyStarvation(t, h, func(in *taskrun.RunTaskInput) { in.Policy.User = shared })
		t.Logf("A and B (%s): %s; %s", shared, held, tried)
		assert.Regexp(t, `^held \d+ EMFILE$`, held)
		assert.Equal(t, "inotify_init EMFILE", tried, "runs sharing a uid starve each other")
	})
}
