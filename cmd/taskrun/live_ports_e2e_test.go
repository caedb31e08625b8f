package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/internal/lockedbuf"
	"github.com/taskrun/taskrun/internal/testdeadline"
)

// portAgent serves HTTP on 127.0.0.1:8080 inside its container: a page, a
// CGI that prints the request's environment, and one that answers slowly.
const portAgent = `mkdir -p /tmp/www/cgi-bin && echo hello-port > /tmp/www/index.html &&
printf '#!/bin/sh\necho Content-Type: text/plain\necho\nenv\n' > /tmp/www/cgi-bin/env &&
printf '#!/bin/sh\nsleep 5\necho Content-Type: text/plain\necho\necho slow\n' > /tmp/www/cgi-bin/slow &&
chmod +x /tmp/www/cgi-bin/env /tmp/www/cgi-bin/slow &&
exec httpd -f -p 127.0.0.1:8080 -h /tmp/www`

// unreachableRE is a connection that failed for want of a route: no
// packet left the sandbox (a timeout would say one did).
var unreachableRE = regexp.MustCompile(`Network is unreachable|No route to host`)

// socketClient is an HTTP client of the daemon's socket.
func socketClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// portCall is GET path on the daemon with token (none when empty): its
// status and body.
func portCall(t *testing.T, c *http.Client, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://taskrun"+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set(daemon.PortTokenHeader, token)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// hostAddr is a non-loopback address of this machine.
func hostAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address")
	return ""
}

// A live run's declared port answers through the daemon with its token
// only, to its tenant only; an undeclared port is not reached; the run's
// container still has no network but loopback, and nothing is published
// on the host.
func TestDaemonLiveRunPorts(t *testing.T) {
	e := newCrashEnv(t)
	d := startDaemon(t, e, filepath.Join(shareDir(t, "taskrun-sock-"), "taskrun.sock"))
	runID := "port" + strings.ToLower(tenant(t)[:8])
	out, stderr, code := d.runClient(t, 0, "--detach", "--user", e.user, "--run-id", runID, "--image", testImage,
		"--port", "8080", "--port", "8081", "--", "sh", "-c", portAgent)
	require.Equal(t, exitOK, code, "%s\n%s", stderr, d.log)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Equal(t, runID, lines[0])
	tokens := map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		require.Len(t, f, 4, l)
		assert.Equal(t, "/v1/runs/"+runID+"/ports/"+f[1]+"/", f[2])
		tokens[f[1]] = f[3]
	}
	require.Len(t, tokens, 2)
	assert.NotEqual(t, tokens["8080"], tokens["8081"])

	c := socketClient(d.sock)
	defer c.CloseIdleConnections()
	base := "/v1/runs/" + runID + "/ports/8080/"
	// The agent may not listen yet.
	var status int
	var body string
	require.Eventually(t, func() bool {
		status, body = portCall(t, c, base, tokens["8080"])
		return status == http.StatusOK
	}, testdeadline.Scale(30*time.Second), 200*time.Millisecond, "the port never answered: %d %s\n%s", status, body, d.log)
	assert.Equal(t, "hello-port\n", body)

	// Round trips of a small page, one connection each.
	const trips = 20
	took := make([]time.Duration, 0, trips)
	for i := 0; i < trips; i++ {
		start := time.Now()
		status, _ = portCall(t, c, base, tokens["8080"])
		took = append(took, time.Since(start))
		require.Equal(t, http.StatusOK, status)
	}
	slices.Sort(took)
	t.Logf("port round trip over %d calls: median %s, p95 %s", trips, took[trips/2], took[trips*95/100])

	// The agent sees the call, not the token.
	status, body = portCall(t, c, base+"cgi-bin/env?x=1", tokens["8080"])
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, "QUERY_STRING=x=1")
	assert.Contains(t, body, "HTTP_X_FORWARDED_PREFIX="+base)
	assert.NotContains(t, body, tokens["8080"])
	assert.NotContains(t, strings.ToUpper(body), "PORT_TOKEN")

	// No token, a wrong one, another port's: 401, and the agent is not reached.
	for name, tok := range map[string]string{"none": "", "wrong": tokens["8080"][:20] + "x", "other port's": tokens["8081"]} {
		status, body = portCall(t, c, base, tok)
		assert.Equal(t, http.StatusUnauthorized, status, "%s token: %s", name, body)
		assert.NotContains(t, body, "hello-port")
	}
	// An undeclared port is not found, with any token or none.
	for _, p := range []string{"9090", "22", "0", "x"} {
		for _, tok := range []string{tokens["8080"], ""} {
			status, _ = portCall(t, c, "/v1/runs/"+runID+"/ports/"+p+"/", tok)
			assert.Equal(t, http.StatusNotFound, status, "port %s", p)
		}
	}
	// A declared port nothing serves on is a bad gateway.
	status, _ = portCall(t, c, "/v1/runs/"+runID+"/ports/8081/", tokens["8081"])
	assert.Equal(t, http.StatusBadGateway, status)

	// Another tenant, with the right token, finds nothing.
	curl, err := exec.LookPath("curl")
	require.NoError(t, err)
	for _, p := range []string{base, "/v1/runs/" + runID + "/ports"} {
		cmd := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", d.sock,
			"-H", daemon.PortTokenHeader+": "+tokens["8080"], "http://taskrun"+p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		got, err := cmd.Output()
		require.NoError(t, err)
		assert.Equal(t, "404", string(got), p)
	}

	// Connections are bounded per run: over the bound, 429.
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := 0; i < daemon.MaxPortConns+4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, "http://taskrun"+base+"cgi-bin/slow", nil)
			req.Header.Set(daemon.PortTokenHeader, tokens["8080"])
			resp, err := c.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				statuses[-1]++
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[resp.StatusCode]++
		}()
	}
	wg.Wait()
	t.Logf("concurrent calls: %v", statuses)
	assert.GreaterOrEqual(t, statuses[http.StatusTooManyRequests], 4)
	assert.LessOrEqual(t, statuses[http.StatusOK], daemon.MaxPortConns)

	// The run still reaches nothing but its loopback: no interface but lo,
	// this machine unreachable; its container has no network and publishes
	// no port.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if conn, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			conn.Close()
		}
	}()
	dc, err := daemon.Dial(context.Background(), d.sock)
	require.NoError(t, err)
	defer dc.Close()
	var netOut lockedbuf.Buffer
	target := net.JoinHostPort(hostAddr(t), fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	res, err := dc.Exec(context.Background(), runID, daemon.ExecRequest{Argv: []string{"sh", "-c",
		"cat /proc/net/dev; nc -w 3 " + target + " </dev/null 2>&1; echo exit $?"}}, &netOut, &netOut)
	require.NoError(t, err)
	require.Empty(t, res.Error)
	assert.Regexp(t, unreachableRE, netOut.String())
	assert.Contains(t, netOut.String(), "exit 1")
	assert.NotContains(t, netOut.String(), "eth0")
	select {
	case <-accepted:
		t.Error("the run reached this machine's network")
	default:
	}
	ids, err := exec.Command("docker", "ps", "-q", "--filter", "label=dev.taskrun.run="+runID).Output()
	require.NoError(t, err)
	id := strings.TrimSpace(string(ids))
	require.NotEmpty(t, id)
	insp, err := exec.Command("docker", "inspect", "--format", "{{json .HostConfig.NetworkMode}} {{json .HostConfig.PortBindings}} {{json .NetworkSettings.Ports}}", id).Output()
	require.NoError(t, err)
	var mode string
	f := strings.Fields(string(insp))
	require.Len(t, f, 3, string(insp))
	require.NoError(t, json.Unmarshal([]byte(f[0]), &mode))
	assert.Equal(t, "none", mode)
	assert.Contains(t, []string{"{}", "null"}, f[1], "ports published on the host")
	assert.Contains(t, []string{"{}", "null"}, f[2], "ports published on the host")

	_, stderr, code = runTaskrun(t, d, "stop", runID)
	require.Equal(t, exitOK, code, stderr)
	e.endedRecord(t, runID)
	e.requireNothingLeft(t, runID)
	// A stopped run's port is gone.
	status, _ = portCall(t, c, base, tokens["8080"])
	assert.Equal(t, http.StatusNotFound, status)
}
