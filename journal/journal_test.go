package journal_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/instance"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
)

// writerEnv makes the test binary a process that updates one record as fast
// as it can until killed.
const writerEnv = "TASKRUN_JOURNAL_TEST_WRITER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(writerEnv); dir != "" {
		os.Exit(writeForever(dir))
	}
	os.Exit(m.Run())
}

func writeForever(dir string) int {
	d, err := journal.Open(dir)
	if err != nil {
		return 3
	}
	e, err := d.Create(record("r-killed"))
	if err != nil {
		return 4
	}
	fmt.Println("ready")
	for i := 0; ; i++ {
		// Records of varying, sizable length, so a torn write would show.
		_ = e.Update(func(r *journal.Record) {
			r.Reason = strings.Repeat(fmt.Sprintf("update %d ", i), 1+i%500)
		})
	}
}

func record(runID string) journal.Record {
	return journal.Record{
		RunID: runID, UserID: "u1", ConversationID: "c1", TaskID: "t1", SessionID: "s1",
		RunDir: "/runs/" + runID, SpoolDir: "/runs/" + runID + ".executor",
		Store: "file:///store", Phase: journal.PhasePrepare,
	}
}

func TestCreateUpdateLoadRemove(t *testing.T) {
	d, err := journal.Open(t.TempDir())
	require.NoError(t, err)
	e, err := d.Create(record("r1"))
	require.NoError(t, err)
	held, err := d.Held("r1")
	require.NoError(t, err)
	assert.True(t, held)

	require.NoError(t, e.Update(func(r *journal.Record) {
		r.Phase = journal.PhaseSupervise
		r.ContainerID = "abc"
	}))
	got, err := d.Load("r1")
	require.NoError(t, err)
	assert.Equal(t, journal.PhaseSupervise, got.Phase)
	assert.Equal(t, "abc", got.ContainerID)
	assert.Equal(t, journal.Version, got.Version)

	recs, err := d.List()
	require.NoError(t, err)
	require.Len(t, recs, 1)

	require.NoError(t, e.Remove())
	_, err = d.Load("r1")
	require.ErrorIs(t, err, journal.ErrNotFound)
	entries, err := os.ReadDir(d.Path())
	require.NoError(t, err)
	assert.Empty(t, entries, "a removed run leaves no record, lock or temporary file")
}

func TestSameRunIDTwiceIsRefusedAndTheFirstUntouched(t *testing.T) {
	d, err := journal.Open(t.TempDir())
	require.NoError(t, err)

	// Many concurrent creates of one run ID: exactly one wins.
	var wg sync.WaitGroup
	entries := make(chan *journal.Entry, 16)
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := record("r-dup")
			rec.Reason = fmt.Sprintf("creator %d", i)
			e, err := d.Create(rec)
			if err != nil {
				errs <- err
				return
			}
			entries <- e
		}()
	}
	wg.Wait()
	close(entries)
	close(errs)
	require.Len(t, entries, 1)
	winner := <-entries
	for err := range errs {
		require.ErrorIs(t, err, journal.ErrExists)
		assert.Contains(t, err.Error(), "pick another run ID")
	}
	got, err := d.Load("r-dup")
	require.NoError(t, err)
	assert.Equal(t, winner.Record().Reason, got.Reason)

	// Once the winner's executor is gone (lock released, record left), the
	// ID is still refused, and the message says how to recover it.
	require.NoError(t, winner.Close())
	_, err = d.Create(record("r-dup"))
	require.ErrorIs(t, err, journal.ErrExists)
	assert.Contains(t, err.Error(), "taskrun gc")

	claimed, err := d.Claim("r-dup")
	require.NoError(t, err)
	_, err = d.Claim("r-dup")
	require.ErrorIs(t, err, journal.ErrBusy)
	require.NoError(t, claimed.Update(func(r *journal.Record) { r.Phase = journal.PhaseKept; r.Reason = "store down" }))
	require.NoError(t, claimed.Close())
	_, err = d.Create(record("r-dup"))
	require.ErrorIs(t, err, journal.ErrExists)
	assert.Contains(t, err.Error(), "taskrun persist --run-id r-dup")
}

func TestInvalidRecordIsRefused(t *testing.T) {
	d, err := journal.Open(t.TempDir())
	require.NoError(t, err)
	rec := record("../escape")
	_, err = d.Create(rec)
	require.Error(t, err)
	_, err = d.Load("../escape")
	require.Error(t, err)
}

// TestKilledWriterNeverLeavesATornRecord kills a process that rewrites a
// record in a loop, many times, and checks the record is whole every time.
func TestKilledWriterNeverLeavesATornRecord(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		runDir := filepath.Join(dir, fmt.Sprint(i))
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), writerEnv+"="+runDir)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "ready\n", line)
		// Let it write for a moment: the kill lands mid-loop, at whatever
		// step of a write it is in.
		for range 1 + i*3 {
			if _, err := os.ReadDir(runDir); err != nil {
				break
			}
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()

		d, err := journal.Open(runDir)
		require.NoError(t, err)
		recs, err := d.List()
		require.NoError(t, err, "every record left by a killed writer parses")
		require.Len(t, recs, 1)
		assert.Equal(t, "r-killed", recs[0].RunID)
		// Its lock died with it: the run can be claimed for recovery.
		e, err := d.Claim("r-killed")
		require.NoError(t, err)
		require.NoError(t, e.Close())
	}
}

// TestFullDiskKeepsThePreviousRecord fills a small tmpfs and checks that an
// update that cannot be written reports ENOSPC and leaves the old record.
func TestFullDiskKeepsThePreviousRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "taskrun-journal-test", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })

	d, err := journal.Open(filepath.Join(dir, "journal"))
	require.NoError(t, err)
	e, err := d.Create(record("r-full"))
	require.NoError(t, err)
	require.NoError(t, e.Update(func(r *journal.Record) { r.Phase = journal.PhaseSupervise }))

	// Fill the filesystem.
	filler, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	_, err = filler.Write(make([]byte, 128<<10))
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NoError(t, filler.Close())

	err = e.Update(func(r *journal.Record) {
		r.Phase = journal.PhaseCollect
		r.Reason = strings.Repeat("x", 16<<10)
	})
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.Contains(t, err.Error(), "is full")

	got, err := d.Load("r-full")
	require.NoError(t, err, "the previous record is intact")
	assert.Equal(t, journal.PhaseSupervise, got.Phase)
	assert.Equal(t, journal.PhaseCollect, e.Record().Phase, "the entry keeps the change for a later write")

	// Space is back: the next update writes the kept change.
	require.NoError(t, os.Remove(filepath.Join(dir, "filler")))
	require.NoError(t, e.Update(func(*journal.Record) {}))
	got, err = d.Load("r-full")
	require.NoError(t, err)
	assert.Equal(t, journal.PhaseCollect, got.Phase)
	require.NoError(t, e.Remove())
}

func TestRedactURL(t *testing.T) {
	assert.Equal(t, "https://cp.example/v1", journal.RedactURL("https://user:pw@cp.example/v1"))
	assert.Equal(t, "s3://bucket?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=us-east-1",
		journal.RedactURL("s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:9000&secret_access_key=S&session_token=T"))
}

func TestWriteFileAtomicReplacesWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.json")
	require.NoError(t, journal.WriteFileAtomic(path, []byte("first"), 0o600))
	require.NoError(t, journal.WriteFileAtomic(path, []byte("second"), 0o600))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "second", string(data))
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file is left")
}

// An executor killed after locking a new run but before journaling it
// leaves only the lock file; listing the journal removes it, but never the
// lock of a run being created or of a kept run.
func TestListRemovesTheLockOfARunNeverJournaled(t *testing.T) {
	dir := t.TempDir()
	d, err := journal.Open(dir)
	require.NoError(t, err)
	orphan, err := instance.TryLock(filepath.Join(dir, "r-orphan.lock"))
	require.NoError(t, err)
	require.NoError(t, orphan.Unlock(false), "the killed executor's flock is gone with it")

	creating, err := instance.TryLock(filepath.Join(dir, "r-creating.lock"))
	require.NoError(t, err)
	defer creating.Unlock(true)

	kept, err := d.Create(record("r-kept"))
	require.NoError(t, err)
	require.NoError(t, kept.Close())

	recs, err := d.List()
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "r-kept", recs[0].RunID)
	assert.NoFileExists(t, filepath.Join(dir, "r-orphan.lock"))
	assert.FileExists(t, filepath.Join(dir, "r-creating.lock"), "held by a live executor")
	assert.FileExists(t, filepath.Join(dir, "r-kept.lock"), "a kept run keeps its lock file")

	again, err := d.Create(record("r-orphan"))
	require.NoError(t, err, "the run ID is free again")
	require.NoError(t, again.Remove())
}

// The judged state is written and read back as it was given, and a copy
// taken with Record is the caller's own.
func TestJudgedStateRoundTrips(t *testing.T) {
	d, err := journal.Open(t.TempDir())
	require.NoError(t, err)
	e, err := d.Create(record("r-judged"))
	require.NoError(t, err)
	defer e.Close()
	ended := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	require.NoError(t, e.Update(func(r *journal.Record) {
		r.Judged = &journal.Judged{Status: model.StatusFailed, Reason: "agent exited with code 4", RunError: "boom", EndedAt: ended, Execution: []byte(`{"exit":{"exit_code":4}}`)}
	}))
	got, err := d.Load("r-judged")
	require.NoError(t, err)
	assert.Equal(t, 2, got.Version)
	require.NotNil(t, got.Judged)
	assert.Equal(t, model.StatusFailed, got.Judged.Status)
	assert.Equal(t, "agent exited with code 4", got.Judged.Reason)
	assert.Equal(t, "boom", got.Judged.RunError)
	assert.True(t, ended.Equal(got.Judged.EndedAt))
	assert.JSONEq(t, `{"exit":{"exit_code":4}}`, string(got.Judged.Execution))

	c := e.Record()
	c.Judged.Execution[2] = 'X'
	c.Judged.Reason = "changed"
	assert.Equal(t, "agent exited with code 4", e.Record().Judged.Reason)
	assert.JSONEq(t, `{"exit":{"exit_code":4}}`, string(e.Record().Judged.Execution))
}
