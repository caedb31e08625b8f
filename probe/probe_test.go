package probe

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleReport(nonce string) Report {
	return Report{Nonce: nonce, UID: 10001, GID: 10001, NoNewPrivs: 1, Seccomp: 2, RootfsReadOnly: true,
		RootfsWriteError: "read-only file system", ProcSysReadOnly: true, PidsMax: 256, MemoryLimit: 1 << 30,
		SocketSearchComplete: true,
		Egress:               []Egress{{Name: "tcp", Target: "1.1.1.1:443", Error: "network is unreachable"}}}
}

func TestInterceptorSplitWrites(t *testing.T) {
	line, err := FormatLine(sampleReport("n1"))
	require.NoError(t, err)
	rest := "agent says hi\nsecond line\n"
	stream := append(append([]byte{}, line...), rest...)

	for _, chunk := range []int{1, 2, 3, 7, 64, len(line) - 1, len(line), len(line) + 1, len(stream)} {
		var out bytes.Buffer
		ic := NewInterceptor(&out, "n1")
		for off := 0; off < len(stream); off += chunk {
			end := min(off+chunk, len(stream))
			n, err := ic.Write(stream[off:end])
			require.NoError(t, err)
			require.Equal(t, end-off, n)
		}
		require.NoError(t, ic.Flush())
		got, ok := ic.Report()
		require.True(t, ok, "chunk %d", chunk)
		assert.Equal(t, sampleReport("n1").PidsMax, got.PidsMax)
		assert.Equal(t, rest, out.String(), "chunk %d: everything after the report passes unchanged", chunk)
	}
}

func TestInterceptorRejectsForgeries(t *testing.T) {
	good, err := FormatLine(sampleReport("n1"))
	require.NoError(t, err)
	wrongNonce, err := FormatLine(sampleReport("other"))
	require.NoError(t, err)
	cases := map[string]string{
		"not a report":           "hello\n" + string(good),
		"wrong nonce":            string(wrongNonce),
		"garbage base64":         "TASKRUN-PROBE n1 !!!\n",
		"report not on line one": "x\n" + string(good),
	}
	for name, stream := range cases {
		var out bytes.Buffer
		ic := NewInterceptor(&out, "n1")
		_, err := ic.Write([]byte(stream))
		require.NoError(t, err)
		require.NoError(t, ic.Flush())
		_, ok := ic.Report()
		assert.False(t, ok, name)
		assert.Equal(t, stream, out.String(), "%s: passed through unchanged", name)
	}
}

func TestInterceptorBoundsItsBuffer(t *testing.T) {
	var out bytes.Buffer
	ic := NewInterceptor(&out, "n1")
	big := bytes.Repeat([]byte("a"), MaxLine/2)
	for range 3 {
		_, err := ic.Write(big)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(ic.buf), MaxLine)
	}
	assert.Equal(t, MaxLine/2*3, out.Len(), "an over-long first line is passed through, not held")
	_, ok := ic.Report()
	assert.False(t, ok)

	// A partial first line without a newline is released by Flush.
	out.Reset()
	ic = NewInterceptor(&out, "n1")
	_, err := ic.Write([]byte("no newline"))
	require.NoError(t, err)
	assert.Zero(t, out.Len())
	require.NoError(t, ic.Flush())
	assert.Equal(t, "no newline", out.String())
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tsh\nUid:\t10001\t10001\t10001\t10001\nGid:\t10002\t10002\t10002\t10002\n" +
		"CapPrm:\t0000000000000000\nCapEff:\t00000000a80425fb\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n" +
		"NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"
	r := Report{NoNewPrivs: Unknown, Seccomp: Unknown}
	require.NoError(t, applyStatus(&r, strings.NewReader(status)))
	assert.Equal(t, 10001, r.UID)
	assert.Equal(t, 10002, r.GID)
	assert.Equal(t, uint64(0xa80425fb), r.CapEff)
	assert.Equal(t, uint64(0x1ffffffffff), r.CapBnd)
	assert.Equal(t, 1, r.NoNewPrivs)
	assert.Equal(t, 2, r.Seccomp)
}

func TestParseMountinfo(t *testing.T) {
	mi := "105 55 0:50 / / ro,nodev,noatime master:3 - overlay overlay rw\n" +
		"106 105 0:52 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n" +
		"120 106 0:52 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw\n" +
		"130 105 8:1 /srv/runs/r\\0401 /taskrun rw,relatime - ext4 /dev/vda rw\n"
	ms, err := parseMountinfo(strings.NewReader(mi))
	require.NoError(t, err)
	require.Len(t, ms, 4)
	root, ok := mountAt(ms, "/")
	require.True(t, ok)
	assert.True(t, root.ReadOnly)
	ps, ok := mountAt(ms, "/proc/sys")
	require.True(t, ok)
	assert.True(t, ps.ReadOnly)
	assert.Equal(t, "/srv/runs/r 1", ms[3].Root)
	assert.False(t, ms[3].ReadOnly)

	_, err = parseMountinfo(strings.NewReader("garbage\n"))
	assert.Error(t, err)
}

func TestParseLimit(t *testing.T) {
	for in, want := range map[string]int64{"256\n": 256, "max\n": Unlimited, "9223372036854771712\n": Unlimited} {
		got, err := parseLimit(in)
		require.NoError(t, err)
		assert.Equal(t, want, got, in)
	}
	_, err := parseLimit("x")
	assert.Error(t, err)
}

func TestContradictions(t *testing.T) {
	pids, mem, uid := int64(256), int64(1<<30), 10001
	full := Expectation{NonRoot: true, UID: &uid, CapEffZero: true, CapBndZero: true, NoNewPrivs: true, SeccompFilter: true,
		RootfsReadOnly: true, ProcSysReadOnly: true, NetworkNone: true, PidsMax: &pids, MemoryLimit: &mem, NoDockerSocket: true}
	assert.Empty(t, full.Contradictions(sampleReport("n")))

	breaks := map[string]func(*Report){
		"uid 0":            func(r *Report) { r.UID = 0 },
		"capabilities":     func(r *Report) { r.CapEff = 1 << 21 },
		"bounding":         func(r *Report) { r.CapBnd = 1 },
		"nnp":              func(r *Report) { r.NoNewPrivs = 0 },
		"nnp unknown":      func(r *Report) { r.NoNewPrivs = Unknown },
		"seccomp":          func(r *Report) { r.Seccomp = 0 },
		"rootfs mount rw":  func(r *Report) { r.RootfsReadOnly = false },
		"rootfs writable":  func(r *Report) { r.RootfsWriteError = "" },
		"proc sys":         func(r *Report) { r.ProcSysReadOnly = false },
		"egress":           func(r *Report) { r.Egress[0].Reachable = true },
		"interface":        func(r *Report) { r.Interfaces = []string{"eth0"} },
		"no egress probe":  func(r *Report) { r.Egress = nil },
		"pids":             func(r *Report) { r.PidsMax = 512 },
		"pids unknown":     func(r *Report) { r.PidsMax = Unknown },
		"memory":           func(r *Report) { r.MemoryLimit = Unlimited },
		"docker socket":    func(r *Report) { r.DockerSockets = []string{"/var/run/docker.sock"} },
		"search cut short": func(r *Report) { r.SocketSearchComplete = false },
	}
	for name, br := range breaks {
		r := sampleReport("n")
		br(&r)
		assert.NotEmpty(t, full.Contradictions(r), name)
	}
	assert.Empty(t, Expectation{}.Contradictions(Report{}), "an empty expectation checks nothing")
}

func TestParseExpectationRejectsUnknownFields(t *testing.T) {
	_, err := ParseExpectation([]byte(`{"network_nnone":true}`))
	assert.Error(t, err)
	e, err := ParseExpectation([]byte(`{"network_none":true,"pids_max":256}`))
	require.NoError(t, err)
	assert.True(t, e.NetworkNone)
	require.NotNil(t, e.PidsMax)
	assert.Equal(t, int64(256), *e.PidsMax)
}

func TestParseLine(t *testing.T) {
	line, err := FormatLine(sampleReport("abc"))
	require.NoError(t, err)
	r, err := ParseLine(line, "abc")
	require.NoError(t, err)
	assert.Equal(t, "abc", r.Nonce)
	_, err = ParseLine(line, "abd")
	assert.ErrorIs(t, err, ErrNotReportLine)
	_, err = FormatLine(sampleReport("has space"))
	assert.Error(t, err)
}

func TestCollectOnHost(t *testing.T) {
	// On the test host: real values are read and nothing panics; the
	// in-container behaviour is tested in docker_test.go.
	// Egress targets stay on loopback so the host test sends nothing out.
	dir := t.TempDir()
	cfg := Config{WalkRoot: dir, TCPTarget: "127.0.0.1:1", MetadataTarget: "127.0.0.1:2", DNSName: "invalid.", EgressTimeout: 200e6}
	r := Collect(context.Background(), "host", cfg)
	assert.True(t, r.SocketSearchComplete, "errors: %v", r.Errors)
	assert.NotEqual(t, Unknown, r.Seccomp)
	assert.NotEmpty(t, r.Mounts)
	require.Len(t, r.Egress, 3)
	for _, e := range r.Egress {
		assert.False(t, e.Reachable, "%s %s", e.Name, e.Target)
	}
}

// fillDir creates n empty files in dir.
func fillDir(t *testing.T, dir string, n int) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for i := range n {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), nil, 0o600))
	}
}

// listenUnix serves a unix socket at path until the test ends.
func listenUnix(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
}

func TestSocketWalkBoundFailsClosed(t *testing.T) {
	root := t.TempDir()
	fillDir(t, filepath.Join(root, "var"), 50)
	cfg := Config{WalkRoot: root, RunDir: filepath.Join(root, "taskrun"), MaxWalkEntries: 10}.withDefaults()

	_, _, err := findDockerSockets(context.Background(), cfg, nil)
	require.ErrorIs(t, err, errWalkBound)

	r := sampleReport("n")
	r.SocketSearchComplete = err == nil
	bad := Expectation{NoDockerSocket: true}.Contradictions(r)
	require.Len(t, bad, 1)
	assert.Contains(t, bad[0], "socket search was incomplete")
}

func TestSocketWalkSkipsRunDirButNotItsMounts(t *testing.T) {
	root := t.TempDir()
	runDir := filepath.Join(root, "taskrun")
	fillDir(t, runDir, 100)
	require.NoError(t, os.Mkdir(filepath.Join(root, "var"), 0o755))
	outside := filepath.Join(root, "var", "s.sock")
	listenUnix(t, outside)
	walkedOnly := filepath.Join(runDir, "walked.sock")
	listenUnix(t, walkedOnly)
	mounted := filepath.Join(runDir, "mounted.sock")
	listenUnix(t, mounted)
	cfg := Config{WalkRoot: root, RunDir: runDir, MaxWalkEntries: 10, SocketTimeout: 200e6}.withDefaults()

	all, docker, err := findDockerSockets(context.Background(), cfg, []Mount{{Target: mounted}})
	require.NoError(t, err, "a full run dir must not exhaust the walk bound")
	assert.Contains(t, all, outside, "sockets outside the run dir are walked")
	assert.Contains(t, all, mounted, "a socket mounted into the run dir is still checked")
	assert.NotContains(t, all, walkedOnly, "the run dir itself is not walked")
	assert.NotContains(t, docker, outside, "a plain socket does not answer Docker's API")
}

func TestSocketWalkUnreadableRootIsIncomplete(t *testing.T) {
	cfg := Config{WalkRoot: filepath.Join(t.TempDir(), "missing")}.withDefaults()
	_, _, err := findDockerSockets(context.Background(), cfg, nil)
	assert.Error(t, err)
}

func TestCollectFindsServiceAccountTokenAndCanSkipEgress(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("x"), 0o600))
	cfg := Config{WalkRoot: dir, SkipEgress: true, TokenPaths: []string{filepath.Join(dir, "absent"), token}}
	r := Collect(context.Background(), "host", cfg)
	assert.Equal(t, []string{token}, r.ServiceAccountTokens)
	assert.Empty(t, r.Egress, "no egress probe dials out when skipped")
	assert.Equal(t, []string{"service account token mounted at [" + token + "], expected none"},
		Expectation{NoServiceAccountToken: true}.Contradictions(r))
	assert.Empty(t, Expectation{}.Contradictions(r))
}

func TestSkippingEgressProbesContradictsNetworkNone(t *testing.T) {
	bad := Expectation{NetworkNone: true, SkipEgressProbes: true}.Contradictions(Report{})
	assert.Contains(t, bad, "expectation asks for network none but skips the egress probes that would confirm it")
}
