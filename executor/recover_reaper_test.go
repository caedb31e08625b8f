package executor_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

// judgingReaper asks the recovery's gone function about executors, as the
// Kubernetes reaper does for each Pod.
type judgingReaper struct {
	ask     map[string][2]string // name: executor ID and process record
	answers map[string]bool
}

func (r *judgingReaper) ReapGone(_ context.Context, gone func(id, process string) (bool, string)) error {
	r.answers = map[string]bool{}
	for name, q := range r.ask {
		r.answers[name], _ = gone(q[0], q[1])
	}
	return nil
}

// On a backend other than Docker, the start-up recovery hands the reaper a
// judgement by lock and process record: an executor holding its lock is
// alive; one whose lock file is gone is gone when its process record says
// its process exited, and never proven gone without a record.
func TestRecoverJudgesSandboxOwnersByLockAndProcessRecord(t *testing.T) {
	r := &judgingReaper{}
	h, err := executor.New(context.Background(), executor.Config{Root: t.TempDir(), Backend: sandboxfake.New(), Reaper: r, Logger: discard})
	require.NoError(t, err)
	live, err := h.Layout().StartInstance()
	require.NoError(t, err)
	defer live.Close()
	exited := exec.Command("true")
	require.NoError(t, exited.Run())
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	deadRecord := fmt.Sprintf("%d/1/%s", exited.Process.Pid, strings.TrimSpace(string(boot)))

	r.ask = map[string][2]string{
		"live":               {live.ID(), live.Info().Process()},
		"exited":             {instance.NewID(), deadRecord},
		"unknown, no record": {instance.NewID(), ""},
	}
	h.Recover(context.Background())
	assert.Equal(t, map[string]bool{"live": false, "exited": true, "unknown, no record": false}, r.answers)
}

// listingBackend is a backend other than Docker that lists its containers
// when caps says so: it records what recovery asks of them.
type listingBackend struct {
	*sandboxfake.Backend
	caps  sandbox.Capabilities
	mu    sync.Mutex
	calls []string
	spare []string
}

func (b *listingBackend) Capabilities() sandbox.Capabilities { return b.caps }

func (b *listingBackend) record(call string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, call)
}

func (b *listingBackend) OrphanExists(_ context.Context, id string) (bool, error) {
	b.record("exists " + id)
	return true, nil
}

func (b *listingBackend) StopOrphan(_ context.Context, id string, _ time.Duration) error {
	b.record("stop " + id)
	return nil
}

func (b *listingBackend) OrphanLogs(_ context.Context, id string, _, _ io.Writer) error {
	b.record("logs " + id)
	return nil
}

func (b *listingBackend) RemoveOrphan(_ context.Context, id string) error {
	b.record("remove " + id)
	return nil
}

func (b *listingBackend) ReapGone(_ context.Context, _ func(string, string) (bool, string), spare []string) (int, error) {
	b.record("reap")
	b.spare = spare
	return 0, nil
}

// The start-up recovery is decided by the backend's capabilities, not its
// type: a backend that says it lists its containers has the journaled run
// of a dead executor recovered (its container stopped, read and removed)
// and the gone executors' containers reaped; the same backend saying it
// does not has only Config.Reaper asked.
func TestRecoverOnAnyBackendThatListsItsContainers(t *testing.T) {
	for _, lists := range []bool{true, false} {
		t.Run(fmt.Sprintf("lists=%v", lists), func(t *testing.T) {
			ctx := context.Background()
			b := &listingBackend{Backend: sandboxfake.New(), caps: sandbox.Capabilities{Kind: "other", ListsContainers: lists}}
			r := &judgingReaper{}
			h, err := executor.New(ctx, executor.Config{Root: t.TempDir(), Backend: b, Reaper: r, Logger: discard})
			require.NoError(t, err)
			defer h.Close(ctx)
			jd, err := h.Journal()
			require.NoError(t, err)
			paths := h.Layout().Paths()
			dir := paths.RuntimeTaskRunDir("user1", "conv1", "task1", "lost1")
			for _, sub := range []string{"home", "artifacts", "global", "output"} {
				require.NoError(t, os.MkdirAll(filepath.Join(dir, sub), 0o755))
			}
			e, err := jd.Create(journal.Record{
				RunID: "lost1", UserID: "user1", ConversationID: "conv1", TaskID: "task1", SessionID: "s1",
				RunDir: dir, SpoolDir: dir + ".executor", Store: "mem://", Phase: journal.PhaseSupervise,
				ContainerID: "the-dead-executors-container",
			})
			require.NoError(t, err)
			require.NoError(t, e.Close(), "the executor died: its record stays, its lock is free")

			h.Recover(ctx)
			_, err = jd.Load("lost1")
			if !lists {
				assert.Empty(t, b.calls, "a backend that cannot list its containers is not asked about them")
				assert.NotNil(t, r.answers, "Config.Reaper reaps instead")
				assert.NoError(t, err, "the run waits for a host that can see its container")
				return
			}
			assert.Equal(t, []string{
				"exists the-dead-executors-container", "stop the-dead-executors-container",
				"logs the-dead-executors-container", "remove the-dead-executors-container", "reap",
			}, b.calls)
			assert.Empty(t, b.spare, "the recovered run's container is not spared")
			assert.Nil(t, r.answers, "Config.Reaper is for backends that cannot list their containers")
			assert.ErrorIs(t, err, journal.ErrNotFound, "the run was recovered")
		})
	}
}
