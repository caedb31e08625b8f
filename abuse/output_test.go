package abuse_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/docker/go-units"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
)

// A stdout flood of 512 MiB does not grow the executor: its heap stays
// within 128 MiB of where it started, the whole flood is stored as
// output.log and streamed, and RunResult.Output is capped with the marker.
//
// Protection: the executor spools stdout to a file and every consumer reads
// the spool on its own (no in-memory buffer of the output), and the result
// keeps only MaxResultOutputBytes of it. Buffering the output in memory
// anywhere on the way breaks the heap ceiling; dropping the cap breaks the
// Output length.
func TestStdoutFloodKeepsExecutorMemoryBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const size = 512 << 20
	in, rec := h.input(t, "stdoutflood", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x`, size))
	sender := newCountingSender()
	in.StreamSender = sender

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak uint64
	o := h.watch(t, in, 50*time.Millisecond, func(string) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
	})
	require.NoError(t, o.err)
	require.NotZero(t, peak, "the heap was sampled while the flood ran")
	growth := int64(peak) - int64(before.HeapInuse)
	t.Logf("heap in use: %d MiB before, peak %d MiB during a %d MiB flood", before.HeapInuse>>20, peak>>20, size>>20)
	assert.Less(t, growth, int64(128<<20), "executor heap grew by %d MiB", growth>>20)

	out := o.out
	assert.Equal(t, model.StatusSucceeded, out.Status)
	assert.Len(t, out.Result.Output, taskrun.MaxResultOutputBytes+len(taskrun.TruncationMarker))
	assert.True(t, strings.HasSuffix(out.Result.OutputStr, taskrun.TruncationMarker))
	assert.Equal(t, strings.Repeat("x", 64), out.Result.OutputStr[:64])
	assert.True(t, last(t, rec).OutputTruncated)

	key, err := persist.RunKey(h.Ref("stdoutflood"), taskrun.OutputLogName)
	require.NoError(t, err)
	info, err := h.Store.Stat(context.Background(), key)
	require.NoError(t, err)
	assert.EqualValues(t, size, info.Size, "output.log holds the complete flood")

	sender.mu.Lock()
	defer sender.mu.Unlock()
	assert.True(t, sender.ordered, "deltas arrived in order")
	assert.EqualValues(t, size, sender.bytes, "every byte was streamed")
	assert.True(t, sender.ended)
	assert.EqualValues(t, size, sender.total)
}

// logEntrySlack bounds how far the json-file logs may exceed max-size x
// max-file: the engine rotates before a write once the file reached
// max-size, so each file may overrun by one entry (a line of at most 16 KiB
// plus its JSON envelope).
const logEntrySlack = 64 << 10

// A flood of three times the log cap never puts more than max-size x
// max-file of container log on the host, while the complete output is still
// stored as output.log.
//
// Protection: the json-file log driver's max-size and max-file options, set
// from Policy.LogMaxSize and LogMaxFile. Without them json-file grows without
// bound and the log files reach the flood's size.
func TestLogFloodIsCappedOnHost(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	h := newHarness(t)
	pol := sandbox.DefaultPolicy()
	maxSize, err := units.RAMInBytes(pol.LogMaxSize)
	require.NoError(t, err)
	logCap := maxSize * int64(pol.LogMaxFile)
	flood := 3 * logCap
	// The sleep keeps the container, and so its log files, alive for the
	// last samples after the flood.
	in, _ := h.input(t, "logflood", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; sleep 2`, flood))
	in.Policy = pol
	in.StreamSender = newCountingSender()

	var logPath string
	var peak int64
	o := h.watch(t, in, 50*time.Millisecond, func(id string) {
		if logPath == "" {
			info, err := h.cli.ContainerInspect(context.Background(), id)
			if err != nil {
				return
			}
			logPath = info.LogPath
		}
		peak = max(peak, logFilesSize(logPath))
	})
	require.NoError(t, o.err)
	require.NotEmpty(t, logPath, "the container's log was found on the host")
	t.Logf("json-file log peak %d bytes for a %d byte flood, cap %d", peak, flood, logCap)
	assert.LessOrEqual(t, peak, logCap+logEntrySlack, "container logs on the host exceed max-size x max-file")
	assert.GreaterOrEqual(t, peak, maxSize, "the flood reached the log files (rotation was exercised)")

	assert.Equal(t, model.StatusSucceeded, o.out.Status)
	key, err := persist.RunKey(h.Ref("logflood"), taskrun.OutputLogName)
	require.NoError(t, err)
	info, err := h.Store.Stat(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, flood, info.Size, "output.log holds the complete flood")
}

// logFilesSize is the total size of a json-file log and its rotations.
func logFilesSize(logPath string) int64 {
	files, _ := filepath.Glob(logPath + "*")
	var total int64
	for _, f := range files {
		if info, err := os.Stat(f); err == nil {
			total += info.Size()
		}
	}
	return total
}

// Symlinks to a host secret, to a host directory and to /, and FIFOs, planted
// in artifacts/ and output/ are not stored, the run does not hang on them,
// and the regular files next to them are stored.
//
// Protection: workspace.Collect, which the executor uses for artifacts and
// output files: it walks the run's directories through os.Root, opens with
// O_NOFOLLOW|O_NONBLOCK and skips every non-regular file. Following a symlink
// stores the canary or host files; opening a FIFO blocking hangs the run.
func TestPlantedSymlinksAndFIFOsAreNotStored(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	canaryDir := t.TempDir()
	canary := filepath.Join(canaryDir, "canary.txt")
	secret := "abuse-canary-" + rand.Text()
	require.NoError(t, os.WriteFile(canary, []byte(secret), 0o600))
	script := fmt.Sprintf(`set -e
cd /taskrun
ln -s /etc/shadow artifacts/leak-shadow
ln -s %[1]s artifacts/leak-canary
ln -s / artifacts/rootdir
mkdir artifacts/sub
ln -s %[2]s artifacts/sub/hostdir
mkfifo artifacts/pipe
echo delivered > artifacts/report.txt
ln -s %[1]s output/result.md
mkfifo output/answer.fifo
echo final > output/final.md
ls -l artifacts artifacts/sub output
`, canary, canaryDir)
	in, _ := h.input(t, "planted", script)

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	assert.Contains(t, out.Result.OutputStr, "leak-canary -> "+canary, "the agent planted the links")
	assert.Contains(t, out.Result.OutputStr, "prw", "the agent planted the FIFOs")

	require.Len(t, out.Artifacts, 1, "only the regular artifact is stored: %v", out.Artifacts)
	artifactKey, err := persist.ArtifactKey(h.Ref("planted"), "report.txt")
	require.NoError(t, err)
	assert.Equal(t, artifactKey, out.Artifacts[0].Key)
	finalKey, err := persist.RunKey(h.Ref("planted"), taskrun.ResultPrefix+"final.md")
	require.NoError(t, err)

	keys := h.storedKeys(t)
	assert.Contains(t, keys, artifactKey)
	assert.Contains(t, keys, finalKey)
	for _, k := range keys {
		for _, planted := range []string{"leak-", "rootdir", "hostdir", "pipe", "result.md", "answer.fifo"} {
			assert.NotContains(t, k, planted, "a planted entry was stored")
		}
	}
	shadow, _ := os.ReadFile("/etc/shadow")
	for _, k := range keys {
		data := h.objectText(t, k)
		assert.NotContains(t, data, secret, "object %s holds the host canary", k)
		if len(shadow) > 0 {
			assert.NotContains(t, data, string(shadow), "object %s holds the host's /etc/shadow", k)
		}
	}
}

// objectText reads a stored object, decompressing gzip (the session state)
// so that its contents can be searched.
func (h *harness) objectText(t *testing.T, key string) string {
	t.Helper()
	rc, err := h.Store.Open(context.Background(), key)
	require.NoError(t, err)
	defer rc.Close()
	data, err := io.ReadAll(rc)
	require.NoError(t, err)
	if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		require.NoError(t, err, "object %s", key)
		data, err = io.ReadAll(zr)
		require.NoError(t, err, "object %s", key)
	}
	return string(data)
}
