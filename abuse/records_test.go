package abuse_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/diskcap"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/records"
	"github.com/taskrun/taskrun/workspace"
)

// objectSize is the size of the stored object at key, 0 when there is none.
func (h *harness) objectSize(t *testing.T, key string) int64 {
	t.Helper()
	info, err := h.Store.Stat(context.Background(), key)
	if err != nil {
		return 0
	}
	return info.Size
}

// runKey is the key of a run object.
func (h *harness) runKey(t *testing.T, runID, name string) string {
	t.Helper()
	key, err := persist.RunKey(h.Ref(runID), name)
	require.NoError(t, err)
	return key
}

// artifactKey is the key of a run's artifact.
func (h *harness) artifactKey(t *testing.T, runID, rel string) string {
	t.Helper()
	key, err := persist.ArtifactKey(h.Ref(runID), rel)
	require.NoError(t, err)
	return key
}

// skipsOf maps "root/path" to the reason of every file the run skipped.
func skipsOf(out *taskrun.Outcome) map[string]string {
	m := map[string]string{}
	for _, s := range out.Skipped {
		m[s.Root+"/"+s.Path] = s.Reason
	}
	return m
}

// An agent flooding stdout and stderr (and so every host-side record) makes
// the executor keep no more on the host than the run's record budget, sized
// from its disk cap: 16 MiB here against 2 x 64 MiB written.
//
// Protection: records.Budget, shared by the spools, the trace lines and the
// gateway record the executor writes. Without it each spool keeps its
// MaxOutputBytes (1 GiB by default): 128 MiB land on the host.
func TestHostRecordsStayWithinTheRunsBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in, _ := h.input(t, "recordflood", `head -c 64m /dev/zero | tr '\0' o; head -c 64m /dev/zero | tr '\0' e >&2; echo done`)
	in.DiskLimitBytes = 16 << 20

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	var kept int64
	for _, name := range []string{taskrun.OutputLogName, taskrun.StderrLogName} {
		key := h.runKey(t, "recordflood", name)
		kept += h.objectSize(t, key)
	}
	budget := records.LimitFor(in.DiskLimitBytes)
	t.Logf("host records kept: %d MiB of a %d MiB budget; %d MiB refused", kept>>20, budget>>20, out.DroppedRecordBytes>>20)
	assert.LessOrEqual(t, kept, budget, "the spools outgrew the run's record budget")
	assert.Greater(t, kept, budget/2, "the budget was used, not refused outright")
	assert.Positive(t, out.DroppedRecordBytes, "the refused bytes are counted")
	assert.Positive(t, out.DroppedOutputBytes)
}

// Sparse files (48 MiB long each, nothing allocated, in a 64 MiB cap) in artifacts, output and
// traces, and a file hard-linked a hundred times into artifacts and output,
// cost the host what was really written: each sparse file is skipped with
// its reason, the linked file is stored once, and the run SUCCEEDS with the
// skips in its record.
//
// Protection: collection reads by allocated size and counts a (dev, ino)
// once across a run (workspace.Ledger). Without it the executor reads,
// hashes and stores 48 MiB of zeros and 200 copies of the 1 MiB file.
func TestCollectionReadsOnlyWhatWasWritten(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in, _ := h.input(t, "sparse", `set -e
mkdir -p /taskrun/global/traces/s1
for d in artifacts output global/traces/s1; do truncate -s 48M /taskrun/$d/sparse.bin; done
head -c 1m /dev/urandom > /taskrun/artifacts/real.bin
for i in $(seq 100); do ln /taskrun/artifacts/real.bin /taskrun/artifacts/link$i.bin; ln /taskrun/artifacts/real.bin /taskrun/output/link$i.bin; done
echo ok`)
	in.DiskLimitBytes = 64 << 20

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)
	var stored int64
	for _, o := range out.Stored {
		stored += o.Size
	}
	t.Logf("stored %d objects, %d KiB in all; %d files skipped", len(out.Stored), stored>>10, len(out.Skipped))
	assert.Less(t, stored, int64(4<<20), "the executor stored more than was written")
	skips := skipsOf(out)
	for _, p := range []string{"artifacts/sparse.bin", "output/sparse.bin", "global/traces/s1/sparse.bin"} {
		assert.Contains(t, skips[p], "sparse file", p)
	}
	links := 0
	for p, r := range skips {
		if strings.Contains(r, "hard link to a file already read") {
			links++
		} else {
			assert.NotContains(t, p, "link", "a link skipped for another reason: %s", r)
		}
	}
	assert.Equal(t, 200, links, "every link but the first read is skipped")
	var record taskrun.CollectionRecord
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "sparse", taskrun.CollectionRecordName)), &record))
	assert.Len(t, record.Skipped, len(out.Skipped), "the skips are in the run's stored record")
	assert.LessOrEqual(t, record.ReadBytes, int64(2<<20))
}

// allocatedBytes is what the run dir costs the host: its image's allocated
// blocks while a capped filesystem is mounted, else the tree's usage.
func allocatedBytes(dir string) int64 {
	img := diskcap.ImagePath(dir)
	var st syscall.Stat_t
	total := int64(0)
	if syscall.Stat(img, &st) == nil {
		total += st.Blocks * 512
	}
	var dst, pst syscall.Stat_t
	if syscall.Stat(dir, &dst) == nil && syscall.Stat(filepath.Dir(dir), &pst) == nil && dst.Dev == pst.Dev {
		used, _ := diskcap.Usage(dir)
		total += used
	}
	return total
}

// A run whose directory is kept (--keep, where a watchdog used to stand in
// for the kernel's cap) cannot take more host disk than its cap with one
// fallocate far past it: the call fails with ENOSPC inside, the host's usage
// sampled during the run never passes the cap, and the kept directory is a
// plain one, holding no mount, afterwards.
//
// Protection: kept runs run on the loop-mounted cap too, and diskcap.Keep
// copies out what was allocated after the run. Without it the watchdog
// polls after the fact and the 4 GiB fallocate lands at once (and stays).
func TestFallocateInAKeptRunDirStaysUnderTheCap(t *testing.T) {
	t.Parallel()
	for _, rt := range runtimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.requireRuntime(t, rt.runtime)
			runID := "fallockeep" + rt.name
			in, _ := h.input(t, runID, `fallocate -l 4294967296 /taskrun/home/big 2>&1; echo "fallocate exited $?"; sleep 2`)
			in.Policy.Runtime = rt.runtime
			const limit = 32 << 20
			in.DiskLimitBytes = limit
			in.KeepRunDir = true
			dirs, err := workspace.NewPaths(h.Root).Run(h.Ref(runID))
			require.NoError(t, err)
			t.Cleanup(func() { _ = diskcap.Release(dirs.Dir); _ = os.RemoveAll(dirs.Dir) })

			var peak int64
			samples := 0
			o := h.watch(t, in, 20*time.Millisecond, func(string) {
				samples++
				peak = max(peak, allocatedBytes(dirs.Dir))
			})
			require.NoError(t, o.err)
			t.Logf("peak host usage %d MiB over %d samples, cap %d MiB", peak>>20, samples, limit>>20)
			assert.Positive(t, samples)
			assert.LessOrEqual(t, peak, int64(limit+diskcap.ImageOverhead), "the run dir took more host disk than its cap")
			assert.Contains(t, o.out.Result.OutputStr, "No space left on device")
			assert.Contains(t, o.out.Result.OutputStr, "fallocate exited 1")
			assert.LessOrEqual(t, allocatedBytes(dirs.Dir), int64(limit), "the kept copy is within the cap")
			var dst, pst syscall.Stat_t
			require.NoError(t, syscall.Stat(dirs.Dir, &dst))
			require.NoError(t, syscall.Stat(filepath.Dir(dirs.Dir), &pst))
			assert.Equal(t, pst.Dev, dst.Dev, "the kept run dir is no mount point")
			assert.FileExists(t, filepath.Join(dirs.Home, "big"), "the kept dir holds what the run left")
		})
	}
}

// Files whose names cannot be store keys (invalid UTF-8, C0/C1 controls,
// bidi overrides, the file store's .attrs suffix, an over-long element), in
// artifacts, output and traces, and a file where an earlier run stored a
// file of the same name as a directory, never break a run: each is skipped
// with its reason, every other file (those sorted after them too) is stored,
// the run SUCCEEDS and its directory is released.
//
// Protection: names are checked by persist before any upload
// (persist.ValidateRelPath, CheckAgentGlobalPath), a key the store refuses
// (persist.ErrKeyRejected) is a skip, not a failure. Without it the first
// bad name fails the persist, the files after it are lost, the run dir and
// its mount are kept, and every retry fails the same way.
func TestUnstorableNamesAreSkippedNotFatal(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	first, _ := h.input(t, "names1", `mkdir -p /taskrun/global/traces/s1; echo one > /taskrun/global/traces/s1/notes`)
	_, err := taskrun.Execute(context.Background(), first)
	require.NoError(t, err)

	long := strings.Repeat("L", 220)
	in, _ := h.input(t, "names2", `set -e
mkdir -p /taskrun/global/traces/s1/notes
for d in artifacts output global/traces/s1; do
  cd /taskrun/$d
  echo x > "$(printf 'bad\377utf8')"
  echo x > "$(printf 'c0\001ctl')"
  echo x > "$(printf 'c1\302\233ctl')"
  echo x > "$(printf 'invoice\342\200\256fdp.exe')"
  echo x > "$(printf 'iso\342\201\246late')"
  echo x > meta.attrs
  echo x > `+long+`
  echo good > zz-good.txt
done
echo nested > /taskrun/global/traces/s1/notes/inner
echo answer > /taskrun/output/result.md`)
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, model.StatusSucceeded, out.Status)

	keys := h.storedKeys(t)
	for _, k := range []string{
		h.artifactKey(t, "names2", "zz-good.txt"),
		h.runKey(t, "names2", "output/zz-good.txt"),
		h.runKey(t, "names2", "output/result.md"),
	} {
		assert.Contains(t, keys, k)
	}
	assert.Contains(t, keys, "tenants/"+h.Tenant+"/global/traces/s1/zz-good.txt")
	skips := skipsOf(out)
	for _, root := range []string{"artifacts", "output", "global/traces/s1"} {
		for _, name := range []string{"bad\377utf8", "c0\001ctl", "c1\302\233ctl", "invoice\u202efdp.exe", "iso\u2066late", "meta.attrs", long} {
			assert.NotEmpty(t, skips[root+"/"+name], "%s/%q is listed as skipped", root, name)
		}
	}
	assert.Contains(t, skips["global/traces/s1/notes/inner"], "refused this key")
	assert.NoDirExists(t, filepath.Join(h.Root, "users", h.Tenant, "conversations", "conv1", "tasks", "task1", "runs", "names2"),
		"the run dir is released: nothing is kept for a retry")
}

// fakeModel is an OpenAI-style upstream that answers every chat request.
func fakeModel(t *testing.T) *httptest.Server {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A later run of the same session cannot replace an earlier run's
// executor-owned records: run 2 writes a forged gw_<run 1>.jsonl and
// rt_<run 1>.jsonl into /taskrun/global, and run 1's stored gateway record
// and trace stay byte for byte what run 1 stored; run 2 lists the forgeries
// as skipped.
//
// Protection: persist.CheckAgentGlobalPath reserves every run's trace and
// gateway record names for that run's own executor. Without it run 2's
// collection uploads the forgeries over run 1's records.
func TestLaterRunCannotForgeAnEarlierRunsRecords(t *testing.T) {
	t.Parallel()
	onPaths(t, func(t *testing.T, h *harness) {
		upstream := fakeModel(t)
		keyFile := filepath.Join(t.TempDir(), "key")
		require.NoError(t, os.WriteFile(keyFile, []byte("sk-abuse"), 0o600))
		in, _ := h.input(t, "owner1", `/.taskrun/bin/taskrun-relay -- sh -c 'wget -qO- --header "Content-Type: application/json" \
  --post-data "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" $OPENAI_BASE_URL/chat/completions'
echo '{"agent":"run 1"}' >> /taskrun/global/traces/s1/rt_owner1.jsonl`)
		in.Model = config.ModelEntry{Provider: config.ProviderOpenAI, Name: "gpt-test", BaseURL: upstream.URL, APIKeyFile: keyFile}
		_, err := h.execute(in)
		require.NoError(t, err)
		read := func(rel string) string {
			rc, err := h.Store.OpenGlobalFile(context.Background(), h.Tenant, rel)
			require.NoError(t, err, rel)
			defer rc.Close()
			b, err := io.ReadAll(rc)
			require.NoError(t, err)
			return string(b)
		}
		gw, trace := read("traces/s1/gw_owner1.jsonl"), read("traces/s1/rt_owner1.jsonl")
		require.Contains(t, gw, "chat/completions", "run 1's gateway record holds its exchange")
		require.Contains(t, trace, "run 1")

		forger, _ := h.input(t, "forger2", `mkdir -p /taskrun/global/traces/s1
echo '{"forged":true}' > /taskrun/global/traces/s1/gw_owner1.jsonl
echo '{"forged":true}' > /taskrun/global/traces/s1/rt_owner1.jsonl
echo '{"forged":true}' > /taskrun/global/traces/s1/gw_forger2.jsonl
echo '{"agent":"run 2"}' > /taskrun/global/traces/s1/rt_forger2.jsonl`)
		out, err := h.execute(forger)
		require.NoError(t, err)
		assert.Equal(t, model.StatusSucceeded, out.Status)

		assert.Equal(t, gw, read("traces/s1/gw_owner1.jsonl"), "run 1's gateway record was replaced")
		assert.Equal(t, trace, read("traces/s1/rt_owner1.jsonl"), "run 1's trace was replaced")
		assert.Contains(t, read("traces/s1/rt_forger2.jsonl"), "run 2", "run 2's own trace is stored")
		_, err = h.Store.OpenGlobalFile(context.Background(), h.Tenant, "traces/s1/gw_forger2.jsonl")
		assert.Error(t, err, "a run without a model has no gateway record, and the agent cannot make one")
		skips := skipsOf(out)
		for _, p := range []string{"gw_owner1.jsonl", "rt_owner1.jsonl", "gw_forger2.jsonl"} {
			assert.Contains(t, skips["global/traces/s1/"+p], "reserved", p)
		}
		var rec struct {
			Skipped []taskrun.SkippedFile `json:"skipped"`
		}
		require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "forger2", taskrun.CollectionRecordName)), &rec))
		assert.Len(t, rec.Skipped, len(out.Skipped))
	})
}
