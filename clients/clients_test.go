package clients_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/sandbox"
)

// The Python and TypeScript clients' tests, run against a real `taskrun
// serve` and a real `taskrun worker` (real containers) on loopback.

// testImage is the image the worker offers: `make images` builds it.
const testImage = "taskrun/testbox:local"

// EnvRequire, set to 1 (the Makefile sets it when CI=true, as does CI=true
// itself), makes a missing python3 or node a failure instead of a skip.
const EnvRequire = "TASKRUN_REQUIRE_CLIENTS"

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	removeBin()
	os.Exit(code)
}

// required reports whether a missing interpreter fails the test.
func required() bool {
	return os.Getenv(EnvRequire) == "1" || os.Getenv("CI") == "true"
}

// interpreter returns the path of name if it is installed and new enough
// (check, run with it, exits 0), or skips (fails when required).
func interpreter(t *testing.T, name, client, version string, check ...string) string {
	t.Helper()
	missing := func(why string) {
		msg := fmt.Sprintf("%s: the %s client's tests need %s %s", why, client, name, version)
		if required() {
			t.Fatal(msg + " (required: CI=true or " + EnvRequire + "=1)")
		}
		t.Skip(msg)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		missing(name + " is not installed")
	}
	if out, err := exec.Command(p, check...).CombinedOutput(); err != nil {
		missing(fmt.Sprintf("%s is too old (%v: %s)", p, err, bytes.TrimSpace(out)))
	}
	return p
}

func TestPythonClient(t *testing.T) {
	py := interpreter(t, "python3", "Python", "3.11 or later",
		"-c", "import sys; print(sys.version); sys.exit(sys.version_info < (3, 11))")
	cp := startControlPlane(t)
	startDaemon(t)
	cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", "tests")
	cmd.Dir = filepath.Join(moduleRoot(), "clients", "python")
	out := cp.runClientTests(t, cmd)
	assert.NotContains(t, out, "skipped", "every Python test ran")
}

func TestTypeScriptClient(t *testing.T) {
	node := interpreter(t, "node", "TypeScript", "20 or later",
		"-e", "console.log(process.version); process.exit(Number(process.versions.node.split('.')[0]) >= 20 ? 0 : 1)")
	cp := startControlPlane(t)
	startDaemon(t)
	cmd := exec.Command(node, "--test", "test/")
	cmd.Dir = filepath.Join(moduleRoot(), "clients", "typescript")
	out := cp.runClientTests(t, cmd)
	assert.NotContains(t, out, "# SKIP", "every TypeScript test ran")
}

// controlPlane is a running serve and worker with two users' tokens.
type controlPlane struct {
	url, metrics                  string
	userToken, otherToken, worker string
	runLog                        string
}

// runClientTests runs cmd with the control plane's address and tokens in its
// environment, fails the test if it fails, and returns its output.
func (cp *controlPlane) runClientTests(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	cmd.Env = append(os.Environ(),
		"TASKRUN_URL="+cp.url,
		"TASKRUN_TOKEN="+cp.userToken,
		"TASKRUN_OTHER_TOKEN="+cp.otherToken,
		"TASKRUN_WORKER_TOKEN="+cp.worker,
		"TASKRUN_TEST_IMAGE="+testImage,
		"TASKRUN_CLIENT_RUN_LOG="+cp.runLog,
		"TASKRUN_WORKER_METRICS="+cp.metrics,
		"PYTHONDONTWRITEBYTECODE=1",
	)
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(8*time.Minute))
	defer cancel()
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Dir, c.Env = cmd.Dir, cmd.Env
	out, err := c.CombinedOutput()
	t.Logf("%s:\n%s", strings.Join(c.Args, " "), out)
	require.NoError(t, err, "the client's tests failed (output above)")
	ids, err := os.ReadFile(cp.runLog)
	require.NoError(t, err, "the client's tests recorded no run")
	require.NotEmpty(t, strings.Fields(string(ids)))
	return string(out)
}

// startControlPlane starts `taskrun serve` (SQLite, a file store) and one
// `taskrun worker` with two slots, both stopped when the test ends.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real containers")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the worker loop-mounts each run's disk cap")
	}
	if err := exec.Command("docker", "image", "inspect", testImage).Run(); err != nil {
		t.Fatalf("image %s is missing: run make images (%v)", testImage, err)
	}
	bin := taskrunBin(t)
	dir := t.TempDir()
	cp := &controlPlane{
		userToken:  "alice-" + rand.Text(),
		otherToken: "bob-" + rand.Text(),
		worker:     "worker-" + rand.Text(),
		runLog:     filepath.Join(dir, "runs.txt"),
	}
	// Registered first, so it runs after serve and the worker stopped.
	t.Cleanup(func() { requireNoContainerLeft(t, cp.runLog, filepath.Join(dir, "worker.log")) })
	wtok, utok := filepath.Join(dir, "w.tok"), filepath.Join(dir, "u.tok")
	require.NoError(t, os.WriteFile(wtok, []byte(cp.worker+"\n"), 0o600))
	require.NoError(t, os.WriteFile(utok, []byte("alice "+cp.userToken+"\nbob "+cp.otherToken+"\n"), 0o600))
	store := "file://" + filepath.Join(dir, "store")
	addr := freeAddr(t)
	cp.url = "http://" + addr
	start(t, bin, filepath.Join(dir, "serve.log"), "serve", "--log-format", "json", "--listen", addr,
		"--db", "sqlite://"+filepath.Join(dir, "cp.db"), "--store", store,
		"--worker-token-file", wtok, "--user-token-file", utok, "--lease-ttl", "4s")
	require.Eventually(t, func() bool {
		resp, err := http.Get(cp.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, testdeadline.Scale(time.Minute), 20*time.Millisecond, "serve %s never became ready", cp.url)
	cp.metrics = freeAddr(t)
	start(t, bin, filepath.Join(dir, "worker.log"), "worker", "--log-format", "json",
		"--server", cp.url, "--token-file", wtok, "--slots", "2",
		"--store", store, "--root", filepath.Join(dir, "root"), "--image", testImage,
		"--labels", "runtime=runc,image="+testImage, "--helpers-dir", testbin.Dir(t),
		"--drain-grace", "5s", "--lease-wait", "2s", "--metrics-listen", cp.metrics, "--live-listen", freeAddr(t),
		"--disk", "64m", "--max-output", "16m", "--timeout", "5m")
	return cp
}

// startDaemon starts `taskrun daemon` on a socket of its own, named to the
// client's tests by $TASKRUN_HOST (the live runs' process API), stopped
// when the test ends.
func startDaemon(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "taskrun.sock")
	t.Setenv("TASKRUN_HOST", sock)
	start(t, taskrunBin(t), filepath.Join(dir, "daemon.log"), "daemon", "--root", filepath.Join(dir, "root"),
		"--store", "file://"+filepath.Join(dir, "store"), "--image", testImage, "--helpers-dir", testbin.Dir(t))
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, testdeadline.Scale(time.Minute), 20*time.Millisecond, "the daemon never answered at %s", sock)
}

// requireNoContainerLeft checks that no container is left of the runs whose
// IDs runLog lists, once serve and the worker stopped. The worker's shutdown
// bounds how long it waits for a removal it asked for; the engine finishes
// that removal on its own, which takes seconds on a loaded host, so the check
// waits for it. A container still there is reported with the worker's log
// and then removed, so it does not outlive the test.
func requireNoContainerLeft(t *testing.T, runLog, workerLog string) {
	ids, err := os.ReadFile(runLog)
	if err != nil {
		return // no run was submitted
	}
	for _, id := range strings.Fields(string(ids)) {
		var left string
		gone := assert.Eventually(t, func() bool {
			out, err := exec.Command("docker", "ps", "-aq", "--filter", "label="+sandbox.LabelRun+"="+id).Output()
			left = strings.TrimSpace(string(out))
			return err == nil && left == ""
		}, testdeadline.Scale(30*time.Second), 250*time.Millisecond, "a container of run %s is left", id)
		if !gone {
			state, _ := exec.Command("docker", "inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}} labels={{json .Config.Labels}}", left).CombinedOutput()
			t.Logf("container %s: %s", left, state)
			if data, err := os.ReadFile(workerLog); err == nil {
				t.Logf("worker log (last 8000 bytes):\n%s", data[max(0, len(data)-8000):])
			}
			_ = exec.Command("docker", "rm", "-f", left).Run()
		}
	}
}

// start starts the binary with args, its output to logPath; the test's
// cleanup stops it with SIGTERM (SIGKILL after a grace) and, if the test
// failed, logs the tail of its output.
func start(t *testing.T, bin, logPath string, args ...string) {
	t.Helper()
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(testdeadline.Scale(30 * time.Second)):
			t.Logf("taskrun %s did not stop within its grace after SIGTERM: killed", args[0])
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			if len(data) > 4000 {
				data = data[len(data)-4000:]
			}
			t.Logf("taskrun %s log:\n%s", args[0], data)
		}
	})
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// moduleRoot is the repository root, found from this source file.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

var builtBin string

// taskrunBin is the taskrun binary: the one `make build` put in
// TASKRUN_BIN_DIR, or one built for this test process.
func taskrunBin(t *testing.T) string {
	t.Helper()
	if d := os.Getenv(testbin.EnvBinDir); d != "" {
		p := filepath.Join(d, "taskrun")
		_, err := os.Stat(p)
		require.NoError(t, err, "%s=%s has no taskrun: run make build, or unset it", testbin.EnvBinDir, d)
		return p
	}
	if builtBin != "" {
		return builtBin
	}
	dir, err := os.MkdirTemp("", "taskrun-clients-bin-")
	require.NoError(t, err)
	p := filepath.Join(dir, "taskrun")
	cmd := exec.Command("go", "build", "-o", p, "./cmd/taskrun")
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("go build ./cmd/taskrun: %v: %s", err, out.String())
	}
	builtBin = p
	return p
}

// removeBin removes the binary taskrunBin built.
func removeBin() {
	if builtBin != "" {
		_ = os.RemoveAll(filepath.Dir(builtBin))
	}
}
