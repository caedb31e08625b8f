package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/journal"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workerclient"
)

// The host's trust boundary through real `taskrun serve` and `taskrun
// worker` processes: what one tenant's run, or one worker's credential,
// can do to another's.

// awaitRun polls run id until done accepts it, for at most within.
func awaitRun(t *testing.T, c *client.Client, id string, within time.Duration, done func(controlplane.Run) bool, what string) controlplane.Run {
	t.Helper()
	var r controlplane.Run
	var err error
	for end := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if r, err = c.GetRun(context.Background(), id); err == nil && done(r) {
			return r
		}
		if time.Now().After(end) {
			t.Fatalf("run %s: %s within %s (last: %s %q, err %v)", id, what, within, r.Status, r.Error, err)
		}
	}
}

func terminal(r controlplane.Run) bool { return r.Status.Terminal() }

// A worker credential is not a lease: a second worker of the same serve,
// with a valid credential of its own and the run's current epoch, cannot
// report for a run leased to another worker, neither with a guessed lease
// token nor with the real one (as leaked from the holder's journal). Each
// forged renewal and PATCH is refused (403), the run's stored status and output are
// unchanged, and the holder finishes the run normally.
//
// Protection: fencing by holder (the lease token and the name of the
// worker credential it was handed to, both checked on every write).
func TestForgedReportsByAnotherWorkerAreRefusedByServe(t *testing.T) {
	env := newCrashEnv(t)
	const intruderToken = "e2e-intruder-token-0123456789"
	serve := startServeProcsWith(t, env, serveCreds{workers: map[string]string{"intruder": intruderToken}},
		"sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, fleetLeaseTTL())[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	sub, err := c.Submit(ctx, controlplane.SubmitRequest{Prompt: "honest work", Image: testImage, Runtime: "runc",
		Command: []string{"sh", "-c", "echo started; sleep 8; echo honest"}}, nil)
	require.NoError(t, err)
	id := sub.RunID

	fleet := newWorkerFleet(t, env, serve.url)
	holder := fleet.startOn(serve.url, "", 1)
	running := awaitRun(t, c, id, testdeadline.Scale(time.Minute), func(r controlplane.Run) bool {
		return r.Status == model.StatusRunning && r.StreamNext > 0
	}, "never started")
	require.Positive(t, running.Epoch)

	// The holder's lease token, as whoever reads its journal gets it.
	jdir, err := journal.Open(filepath.Join(holder.root, executor.JournalDirName))
	require.NoError(t, err)
	var leaked string
	require.Eventually(t, func() bool {
		rec, err := jdir.Load(id)
		if err == nil && rec.ControlPlane != nil {
			leaked = rec.ControlPlane.LeaseToken
		}
		return leaked != ""
	}, testdeadline.Scale(30*time.Second), 50*time.Millisecond, "the holder journaled its lease")

	forged := "forged output"
	body, err := json.Marshal(workerclient.PatchTaskRunRequest{Status: model.StatusSucceeded, Output: &forged})
	require.NoError(t, err)
	// intrude sends method path as the intruder, with the run's current
	// epoch and token, and returns the status code.
	intrude := func(method, path, token string, body []byte) int {
		req, err := http.NewRequest(method, serve.url+path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+intruderToken)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(workerclient.HeaderFence, strconv.FormatInt(running.Epoch, 10))
		req.Header.Set(workerclient.HeaderLeaseToken, token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	refused := []int{http.StatusForbidden, http.StatusConflict}
	for name, token := range map[string]string{"a guessed lease token": rand.Text() + rand.Text(), "the holder's lease token": leaked} {
		assert.Contains(t, refused, intrude(http.MethodPost, "/v1/leases/"+id+"/renew", token, nil), "forged renewal with %s", name)
		assert.Contains(t, refused, intrude(http.MethodPatch, "/v1/task-runs/"+id, token, body), "forged PATCH with %s", name)

		r, err := c.GetRun(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, model.StatusRunning, r.Status, "after the forged PATCH with %s", name)
		assert.NotContains(t, r.Output, forged, name)
		assert.Equal(t, running.Epoch, r.Epoch, name)
	}

	r := awaitRun(t, c, id, testdeadline.Scale(2*time.Minute), terminal, "never ended")
	assert.Equal(t, model.StatusSucceeded, r.Status, r.Error)
	assert.Equal(t, "started\nhonest\n", r.Output, "the holder's report stands")
	assert.Equal(t, running.Epoch, r.Epoch, "leased once")
	log, err := os.ReadFile(holder.log.Name())
	require.NoError(t, err)
	assert.NotContains(t, string(log), "lease lost", "the holder kept its lease")
}

// An agent under a 64 MiB disk cap leaves four 256 GiB sparse files, a
// terabyte of holes, in a run taken from serve: the run ends well within the
// storing deadline, and its change set, recorded, lists the four files as
// added without a digest (holes are never read).
//
// Protection: change-set hashing skips sparse files (then a byte budget and
// a deadline bound the rest).
func TestSparseFilesThroughServeEndWithAChangeSet(t *testing.T) {
	env := newCrashEnv(t)
	serve := startServeProcs(t, env, "sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, fleetLeaseTTL())[0]
	c, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	sub, err := c.Submit(ctx, controlplane.SubmitRequest{Prompt: "make holes", Image: testImage, Runtime: "runc",
		Command: []string{"sh", "-c", "for i in 0 1 2 3; do truncate -s 256G hole$i || exit 1; done; echo small > small.txt; echo made"},
		Limits:  workerclient.Limits{DiskBytes: 64 << 20}}, nil)
	require.NoError(t, err)
	id := sub.RunID

	newWorkerFleet(t, env, serve.url).startOn(serve.url, "", 1)
	awaitRun(t, c, id, testdeadline.Scale(time.Minute), func(r controlplane.Run) bool { return r.Status != model.StatusQueued }, "never leased")
	leased := time.Now()
	// The storing deadline is 5 minutes and hashing alone may take 2: a
	// run whose holes are never read ends long before either.
	r := awaitRun(t, c, id, testdeadline.Scale(90*time.Second), terminal, "did not end within the bound")
	t.Logf("the run ended %s %s after its lease", r.Status, time.Since(leased).Round(time.Millisecond))
	assert.Equal(t, model.StatusSucceeded, r.Status, r.Error)
	assert.Equal(t, "made\n", r.Output)
	require.NotNil(t, r.Changes, "the change set was recorded")
	assert.Equal(t, 5, r.Changes.Added)

	st, err := persist.Open(ctx, env.store)
	require.NoError(t, err)
	defer st.Close()
	rc, err := st.Open(ctx, r.Changes.List.Key)
	require.NoError(t, err)
	defer rc.Close()
	var set changeset.Set
	require.NoError(t, json.NewDecoder(rc).Decode(&set))
	byPath := map[string]changeset.Change{}
	for _, ch := range set.Changes {
		byPath[ch.Path] = ch
	}
	for i := range 4 {
		ch := byPath["hole"+strconv.Itoa(i)]
		assert.Equal(t, changeset.Added, ch.Kind, "hole%d", i)
		assert.Equal(t, int64(256<<30), ch.NewSize, "hole%d", i)
		assert.Empty(t, ch.NewSHA256, "hole%d", i)
		assert.Contains(t, ch.NotHashed, "sparse file", "hole%d", i)
	}
	assert.NotEmpty(t, byPath["small.txt"].NewSHA256, "a file with its bytes allocated is hashed")
	assert.Equal(t, 4, set.Summary.NotHashed)
}

// engineHasRuntime reports whether the Docker engine has runtime registered.
func engineHasRuntime(t *testing.T, runtime string) bool {
	out, err := exec.Command("docker", "info", "--format", "{{json .Runtimes}}").Output()
	require.NoError(t, err)
	var rts map[string]any
	require.NoError(t, json.Unmarshal(out, &rts))
	_, ok := rts[runtime]
	return ok
}

// loopBackingFiles is every loop device's backing file on the host, as the
// kernel shows it to anyone reading /sys/block.
func loopBackingFiles(t *testing.T) []string {
	paths, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	require.NoError(t, err)
	var files []string
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			files = append(files, strings.TrimSpace(string(b)))
		}
	}
	return files
}

// While one tenant's run, in a conversation with a telling name, runs with
// its disk cap mounted, another tenant's run taken from the same serve by
// the same worker lists /sys/block and reads every loop device's backing
// file: nothing it sees names the first run's tenant, conversation, task or
// run, and no loop device is visible at all. On the host, the loop devices'
// backing files (which the kernel shows to every container) name no run
// either.
//
// Protection: the masked host block paths (/sys/block, /sys/devices/virtual/
// block, /proc/diskstats) inside the run, and disk-cap images kept under
// opaque names. gVisor (runsc) shows none of the host's devices anyway.
func TestNoRunSeesAnotherRunsBlockDevicesThroughServe(t *testing.T) {
	env := newCrashEnv(t)
	suffix := strings.ToLower(rand.Text()[:8])
	victimUser, victimToken := "victim-tenant-"+suffix, "e2e-victim-token-0123456789"
	serve := startServeProcsWith(t, env, serveCreds{users: map[string]string{victimUser: victimToken}},
		"sqlite://"+filepath.Join(t.TempDir(), "cp.db"), 1, fleetLeaseTTL())[0]
	victim, err := client.New(serve.url, victimToken, nil)
	require.NoError(t, err)
	spy, err := client.New(serve.url, fleetUserToken, nil)
	require.NoError(t, err)
	ctx := context.Background()

	runtimes := []string{"runc"}
	labels := []string{}
	if engineHasRuntime(t, "runsc") {
		runtimes = append(runtimes, "runsc")
		labels = append(labels, "--labels", "runtime=runsc")
	}
	worker := newWorkerFleet(t, env, serve.url).startOn(serve.url, "", 2, labels...)

	conversation := "secret-project-" + suffix
	vsub, err := victim.Submit(ctx, controlplane.SubmitRequest{Prompt: "secret work", ConversationID: conversation,
		Image: testImage, Runtime: "runc", Command: []string{"sh", "-c", "echo up; sleep 100"}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = victim.Cancel(context.Background(), vsub.RunID) })
	awaitRun(t, victim, vsub.RunID, testdeadline.Scale(time.Minute), func(r controlplane.Run) bool {
		return r.Status == model.StatusRunning && r.StreamNext > 0
	}, "never started")
	names := []string{victimUser, conversation, vsub.TaskID, vsub.RunID}

	// The host side: the victim's disk cap is a loop device whose backing
	// file is under the worker's root, and no backing file names it.
	var ours int
	for _, f := range loopBackingFiles(t) {
		if strings.HasPrefix(f, worker.root+"/") {
			ours++
		}
		for _, n := range names {
			assert.NotContains(t, f, n, "a loop device's backing file names the victim's run")
		}
	}
	require.Positive(t, ours, "control: the victim's disk cap is a loop device")

	const script = `
echo "== sysblock"; ls -A /sys/block 2>&1
echo "== backing"; cat /sys/block/*/loop/backing_file /sys/devices/virtual/block/*/loop/backing_file 2>&1
echo "== virtualblock"; ls -A /sys/devices/virtual/block 2>&1
echo "== diskstats"; cat /proc/diskstats 2>&1
echo "== end"
`
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			sub, err := spy.Submit(ctx, controlplane.SubmitRequest{Prompt: "look around", Image: testImage, Runtime: rt,
				Command: []string{"sh", "-c", script}}, nil)
			require.NoError(t, err)
			r := awaitRun(t, spy, sub.RunID, testdeadline.Scale(2*time.Minute), terminal, "never ended")
			require.Equal(t, model.StatusSucceeded, r.Status, r.Error)
			require.Contains(t, r.Output, "== end", "the script ran to the end")
			v, err := victim.GetRun(ctx, vsub.RunID)
			require.NoError(t, err)
			require.Equal(t, model.StatusRunning, v.Status, "the victim's run was running all along")
			for _, n := range names {
				assert.NotContains(t, r.Output, n, "the spy's run sees the victim's run")
			}
			assert.NotRegexp(t, regexp.MustCompile(`(^|\s)loop[0-9]+(\s|$)`), r.Output, "the spy's run sees the host's loop devices")
			if t.Failed() {
				t.Logf("the spy saw:\n%s", r.Output)
			}
		})
	}

	_, err = victim.Cancel(ctx, vsub.RunID)
	require.NoError(t, err)
	v := awaitRun(t, victim, vsub.RunID, testdeadline.Scale(time.Minute), terminal, "never ended after its cancel")
	assert.Equal(t, model.StatusCancelled, v.Status, v.Error)
}
