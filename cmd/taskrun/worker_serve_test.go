package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/internal/pgtest"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/workerclient"
)

// `taskrun worker` processes against `taskrun serve` processes: the real
// control plane, on SQLite with one replica and on PostgreSQL with two.

const fleetUserToken = "e2e-user-token-0123456789"

// serveProc is one `taskrun serve` process.
type serveProc struct {
	url    string
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

// startServeProcs starts replicas `taskrun serve` processes on db, all
// sharing store, with extra flags, and waits until each is ready. They
// accept the fleet's workerToken (as worker default) and env.user's
// fleetUserToken.
func startServeProcs(t *testing.T, env *crashEnv, db string, replicas int, ttl time.Duration, extra ...string) []*serveProc {
	return startServeProcsWith(t, env, serveCreds{}, db, replicas, ttl, extra...)
}

// serveCreds are the credentials serve processes accept besides the
// defaults: more workers (name to token) and more users (user to token).
type serveCreds struct {
	workers, users map[string]string
}

// startServeProcsWith is startServeProcs accepting creds as well.
func startServeProcsWith(t *testing.T, env *crashEnv, creds serveCreds, db string, replicas int, ttl time.Duration, extra ...string) []*serveProc {
	t.Helper()
	dir := t.TempDir()
	wtok, utok := filepath.Join(dir, "w.tok"), filepath.Join(dir, "u.tok")
	workers, users := "default "+workerToken+"\n", env.user+" "+fleetUserToken+"\n"
	for _, name := range slices.Sorted(maps.Keys(creds.workers)) {
		workers += name + " " + creds.workers[name] + "\n"
	}
	for _, user := range slices.Sorted(maps.Keys(creds.users)) {
		users += user + " " + creds.users[user] + "\n"
	}
	require.NoError(t, os.WriteFile(wtok, []byte(workers), 0o600))
	require.NoError(t, os.WriteFile(utok, []byte(users), 0o600))
	var procs []*serveProc
	for i := range replicas {
		addr := freeAddr(t)
		p := &serveProc{url: "http://" + addr, exited: make(chan struct{}), log: filepath.Join(dir, fmt.Sprintf("serve-%d.log", i))}
		logf, err := os.Create(p.log)
		require.NoError(t, err)
		p.cmd = env.command(t, nil, "serve", "--log-format", "json", "--listen", addr, "--db", db, "--store", env.store,
			"--worker-token-file", wtok, "--user-token-file", utok, "--lease-ttl", ttl.String())
		p.cmd.Args = append(p.cmd.Args, extra...)
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		require.NoError(t, p.cmd.Start())
		go func() {
			_ = p.cmd.Wait()
			logf.Close()
			close(p.exited)
		}()
		t.Cleanup(func() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(testdeadline.Scale(30 * time.Second)):
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
			if t.Failed() {
				data, _ := os.ReadFile(p.log)
				t.Logf("serve log %s:\n%s", p.url, tail(string(data), 3000))
			}
		})
		procs = append(procs, p)
	}
	for _, p := range procs {
		require.Eventually(t, func() bool {
			resp, err := http.Get(p.url + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, testdeadline.Scale(time.Minute), 20*time.Millisecond, "serve %s never became ready", p.url)
	}
	return procs
}

func TestWorkerFleetAgainstServeSQLite(t *testing.T) {
	env := newCrashEnv(t)
	db := "sqlite://" + filepath.Join(t.TempDir(), "cp.db")
	workerFleetAgainstServe(t, env, startServeProcs(t, env, db, 1, fleetLeaseTTL()))
}

func TestWorkerFleetAgainstServePostgres(t *testing.T) {
	env := newCrashEnv(t)
	db := pgtest.Shared(t).NewDatabase(t)
	workerFleetAgainstServe(t, env, startServeProcs(t, env, db, 2, fleetLeaseTTL()))
}

// workerFleetAgainstServe submits runs through the user API of the serve
// replicas, has three workers (spread over the replicas) execute them, kills
// one midway and restarts it once its leases lapsed, and checks every run
// ended exactly once, with the right status, one container per lease, and
// nothing left on the host.
func workerFleetAgainstServe(t *testing.T, env *crashEnv, serves []*serveProc) {
	ctx := context.Background()
	n := e2eRuns(t)
	taskrunBin(t)
	countCreates := watchCreates(t)
	began := time.Now()
	retryable := map[string]bool{}
	users := make([]*client.Client, len(serves))
	for i, s := range serves {
		c, err := client.New(s.url, fleetUserToken, nil)
		require.NoError(t, err)
		users[i] = c
	}
	for i := range n {
		resp, err := users[i%len(users)].Submit(ctx, controlplane.SubmitRequest{
			Prompt: "say hi", Image: testImage, Runtime: "runc",
			Command:   []string{"sh", "-c", "echo run $TASKRUN_RUN_ID; sleep 0.5"},
			Limits:    workerclient.Limits{MemoryBytes: 128 << 20, TimeoutMillis: 60000},
			Retryable: i%3 == 0,
		}, nil)
		require.NoError(t, err)
		retryable[resp.RunID] = i%3 == 0
	}
	get := func(id string) controlplane.Run {
		r, err := users[0].GetRun(ctx, id)
		require.NoError(t, err)
		return r
	}
	ended := func() (done int) {
		for id := range retryable {
			if get(id).Status.Terminal() {
				done++
			}
		}
		return done
	}

	fleet := newWorkerFleet(t, env, serves[0].url)
	victim := fleet.startOn(serves[0].url, "", 2)
	fleet.startOn(serves[len(serves)-1].url, "", 2)
	fleet.startOn(serves[0].url, "", 2)
	require.Eventually(t, func() bool {
		return ended() >= n/4 && scrape(t, victim.metrics)["taskrun_worker_slots_busy"] > 0
	}, testdeadline.Scale(5*time.Minute), 50*time.Millisecond)
	t.Logf("%s: %d runs ended; killing a worker", time.Since(began), ended())
	require.NoError(t, victim.cmd.Process.Signal(syscall.SIGKILL))
	<-victim.exited
	awaitLeasesSettled(t, slices.Collect(maps.Keys(retryable)), func(id string) leaseState {
		r := get(id)
		return leaseState{terminal: r.Status.Terminal(), queued: r.Status == model.StatusQueued, epoch: r.Epoch}
	})
	restarted := fleet.startOn(serves[len(serves)-1].url, victim.root, 2)
	require.Eventually(t, func() bool { return ended() == n }, testdeadline.Scale(10*time.Minute), 200*time.Millisecond, "every run ends")
	t.Logf("%s: all %d runs ended", time.Since(began), n)

	creates := countCreates()
	lost := 0
	for id, retry := range retryable {
		r := get(id)
		switch {
		case r.Status == model.StatusSucceeded:
			assert.Equal(t, "run "+id+"\n", r.Output, id)
			assert.True(t, r.StreamEnded, id)
			assert.Positive(t, creates[id], "run %s: the engine saw its container", id)
		case r.Status == model.StatusFailed && r.Error == controlplane.ErrorWorkerLost:
			lost++
			assert.False(t, retry && r.Attempts < controlplane.MaxAttempts, "retryable run %s was queued again, not failed", id)
		default:
			t.Errorf("run %s ended %s %q", id, r.Status, r.Error)
		}
		if !retry {
			assert.LessOrEqual(t, r.Attempts, 1, "run %s is not retryable: leased once", id)
		}
		assert.LessOrEqual(t, creates[id], r.Attempts, "run %s: %d containers for %d leases", id, creates[id], r.Attempts)
	}
	t.Logf("%d runs, %d finalized worker lost", n, lost)

	// Each run a worker finished is in the store's run index, once, as
	// `taskrun runs` and the web interface find it.
	st, err := persist.Open(ctx, env.store)
	require.NoError(t, err)
	defer st.Close()
	for id := range retryable {
		if get(id).Status != model.StatusSucceeded {
			continue
		}
		rec, err := runindex.Find(ctx, st, id, env.user)
		if assert.NoError(t, err, "run %s has an index record", id) {
			assert.Equal(t, model.StatusSucceeded, rec.Status, id)
		}
	}

	// Both sides' metrics carry the series.
	for _, s := range serves {
		m := scrape(t, strings.TrimPrefix(s.url, "http://"))
		_, ok := m["taskrun_leases_granted_total"]
		assert.True(t, ok, "serve %s exposes taskrun_leases_granted_total", s.url)
	}
	m := scrape(t, restarted.metrics)
	assert.Equal(t, 2.0, m["taskrun_worker_slots_total"])
	_, ok := m["taskrun_worker_lease_acquisitions_total"]
	assert.True(t, ok)

	// SIGTERM drains every worker, once the restarted one recovered; each
	// exits 0.
	awaitRecovered(t, restarted)
	for _, p := range fleet.procs {
		if p != victim {
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		}
	}
	for _, p := range fleet.procs {
		if p == victim {
			continue
		}
		select {
		case <-p.exited:
		case <-time.After(testdeadline.Scale(2 * time.Minute)):
			t.Fatal("a draining worker did not exit")
		}
		assert.NoError(t, p.err, "a drained worker exits 0")
	}

	// Nothing is left on the host.
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=dev.taskrun.managed", "--format", `{{.Label "dev.taskrun.run"}}`).Output()
	require.NoError(t, err)
	for _, run := range strings.Fields(string(out)) {
		_, ours := retryable[run]
		assert.False(t, ours, "container of run %s left", run)
	}
	mounts, err := os.ReadFile("/proc/mounts")
	require.NoError(t, err)
	var roots []string
	for _, p := range fleet.procs {
		roots = append(roots, p.root)
		assert.NotContains(t, string(mounts), p.root+"/", "a mount under a worker's root is left")
		entries, _ := os.ReadDir(filepath.Join(p.root, "journal"))
		for _, e := range entries {
			_, ours := retryable[strings.TrimSuffix(e.Name(), ".json")]
			assert.False(t, ours, "journal record %s left under %s", e.Name(), p.root)
		}
	}
	assertNoLoopDevices(t, roots)
}
