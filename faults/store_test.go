package faults

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist/s3test"
)

// storeFSSize is the size of the filesystem the full-store case puts the
// store on.
const storeFSSize = 32 << 20

// smallFS mounts a fresh ext4 filesystem of size bytes (a loop device) on a
// temporary directory, unmounted and detached when t ends.
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	unmount, err := diskcap.Mount(context.Background(), dir, size)
	require.NoError(t, err, "mount a %d MiB filesystem", size>>20)
	t.Cleanup(func() { assert.NoError(t, unmount()) })
	return dir
}

// fill writes path until its filesystem has no block left, in smaller and
// smaller writes, and returns a func that removes it again.
func fill(t *testing.T, path string) (free func()) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	for _, size := range []int{1 << 20, 64 << 10, 4 << 10, 512, 1} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				require.ErrorIs(t, err, syscall.ENOSPC)
				break
			}
		}
		_ = f.Sync()
	}
	return func() { require.NoError(t, os.Remove(path)) }
}

// The store full (every write refused with ENOSPC) while a run ends, on a
// file store and on S3 (versitygw), each on a 32 MiB ext4 filesystem filled
// up: `taskrun run` keeps the run on the host with the reason (its journal
// record kept, its output on the host, no container, no mount), and once
// the store has room `taskrun persist --all` stores it whole, indexed once
// with the run's own verdict, and nothing of it is left on the host. It
// fails if a full store lost the run's output, reported it stored, held a
// container or a mount while kept, or if the retry stored it twice.
func TestFullStoreKeepsTheRunUntilPersistStoresIt(t *testing.T) {
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t)
			fs := smallFS(t, storeFSSize)
			switch kind {
			case "file":
				require.NoError(t, os.MkdirAll(filepath.Join(fs, "store"), 0o755))
				e.store = "file://" + filepath.Join(fs, "store")
			case "s3":
				e.store = s3test.StartServerIn(t, fs).URL
			}
			free := fill(t, filepath.Join(fs, "filler"))

			runID := "full" + randomID()
			const lines = 200
			run := e.command(t, e.runArgs(runID, []string{"--disk", "32m"}, printer(lines)...)...)
			var stdout, stderr strings.Builder
			run.Stdout, run.Stderr = &stdout, &stderr
			done := make(chan error, 1)
			require.NoError(t, run.Start())
			go func() { done <- run.Wait() }()
			var runErr error
			select {
			case runErr = <-done:
			case <-time.After(testdeadline.Scale(5 * time.Minute)):
				_ = run.Process.Kill()
				t.Fatalf("taskrun run did not end with the store full: %s", tail(stderr.String(), 2000))
			}
			t.Logf("taskrun run: exit %d; stderr:\n%s", exitCode(runErr), tail(stderr.String(), 1500))
			assert.Error(t, runErr, "a run the store could not keep is not reported stored")
			assert.Equal(t, lines, requireNumberedLines(t, stdout.String()), "the run printed every line")

			// Kept on the host, with the reason, holding nothing.
			jd, err := taskrun.OpenRunJournal(e.root)
			require.NoError(t, err)
			rec, err := jd.Load(runID)
			require.NoError(t, err, "the journal keeps the run the store refused")
			assert.Equal(t, journal.PhaseKept, rec.Phase)
			assert.NotEmpty(t, rec.Reason)
			assert.Contains(t, strings.ToLower(rec.Reason), "no space left on device", "the reason names the full store")
			t.Logf("kept: phase %s, reason %q", rec.Phase, rec.Reason)
			ps, err := exec.Command("docker", "ps", "-aq", "--filter", "label=dev.taskrun.run="+runID).Output()
			require.NoError(t, err)
			assert.Empty(t, strings.TrimSpace(string(ps)), "a kept run holds no container")
			mounts, err := os.ReadFile("/proc/mounts")
			require.NoError(t, err)
			assert.NotContains(t, string(mounts), e.root+"/", "a kept run holds no mount")

			// A retry while the store is still full keeps it again.
			again, err := e.command(t, "persist", "--all", "--root", e.root).CombinedOutput()
			t.Logf("persist --all into the full store: exit %d: %s", exitCode(err), tail(string(again), 300))
			assert.Contains(t, string(again), "1 run(s) still kept")
			_, err = jd.Load(runID)
			require.NoError(t, err, "a failed retry keeps the run: %s", again)

			free()
			pout, err := e.command(t, "persist", "--all", "--root", e.root).CombinedOutput()
			require.NoError(t, err, "%s", pout)
			assert.Contains(t, string(pout), "0 run(s) still kept")
			assert.Equal(t, lines, requireNumberedLines(t, e.outputLog(t, runID)), "the store holds every line")
			e.requireIndexedOnce(t, model.StatusSucceeded)
			e.requireNoLocalTrace(t, runID)
		})
	}
}
