package taskrun_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// egressScript shows what the run sees of the network and uses the proxy:
// one allowed request, one refused.
const egressScript = `
echo "== env"; env | grep -i -e proxy -e _CA -e SSL_CERT | sort
echo "== allowed"; wget -q -O - "http://127.0.0.1:$WEB_PORT/hello"; echo
echo "== denied"; wget -q -O - "http://blocked.example/" 2>&1
echo "== listening"; cat /proc/net/tcp
echo "== end"
`

// relayListening is how /proc/net/tcp shows a listener on 127.0.0.1:8412
// (egress.RelayAddr).
const relayListening = "0100007F:20DC 00000000:0000 0A"

// A run with an egress policy reaches what the policy allows through its
// proxy, is refused the rest with a reason, stores every connection in
// egress.jsonl and the policy and totals in audit.json, and no credential
// value reaches the sandbox or the store.
func TestRunTaskWithEgressPolicy(t *testing.T) {
	for _, runtime := range []string{"", sandbox.RuntimeGVisor} {
		t.Run("runtime="+runtime, func(t *testing.T) { checkRunWithEgressPolicy(t, runtime) })
	}
}

func checkRunWithEgressPolicy(t *testing.T, runtime string) {
	const canary = "canary-egress-run-5b1e"
	t.Setenv("TASKRUN_TEST_EGRESS_TOKEN", canary)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the host, auth=%q", r.Header.Get("Authorization"))
	}))
	defer web.Close()
	u, err := url.Parse(web.URL)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)

	storeDir := t.TempDir()
	h := &harness{runtest.New(t, runtest.Options{StoreURL: "file://" + storeDir})}
	if runtime != "" {
		requireRunsc(t, h)
	}
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "egress1", "sh", "-c", "WEB_PORT="+strconv.Itoa(port)+"; "+egressScript)
	in.HelpersDir = testbin.Dir(t)
	in.Policy = sandbox.DefaultPolicy()
	in.Policy.Runtime = runtime
	// The run has a leased uid of its own: the proxy's socket is its.
	uids, err := uidpool.New(t.TempDir(), uidpool.Range{First: 290000, Last: 290999})
	require.NoError(t, err)
	in.UIDs = uids
	in.Egress = egress.Policy{
		Rules: []egress.Rule{{Host: "127.0.0.1", Port: port}, {Host: "api.github.com", Port: 443}},
		// Read on the host at start; never used here (plain HTTP never carries one).
		Credentials: []egress.Credential{{Host: "api.github.com", Header: "Authorization", ValueEnv: "TASKRUN_TEST_EGRESS_TOKEN", Format: "Bearer %s"}},
	}

	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	stdout := out.Result.OutputStr
	require.Contains(t, stdout, "== end", stdout)
	assert.Contains(t, stdout, "HTTP_PROXY=http://127.0.0.1:8412")
	assert.Contains(t, stdout, "SSL_CERT_FILE=/taskrun/.gateway/egress-ca-bundle.pem", "api.github.com is intercepted for its credential")
	assert.Contains(t, stdout, `hello from the host, auth=""`)
	assert.Contains(t, stdout, "403 Forbidden by taskrun egress policy: no rule allows blocked.example:80")
	assert.Contains(t, stdout, relayListening, "the relay listens for the proxy")

	// Every connection is in the stored record.
	var entries []egress.Entry
	for _, line := range strings.Split(strings.TrimSpace(h.runFile(t, "egress1", egress.RecordName)), "\n") {
		var e egress.Entry
		require.NoError(t, json.Unmarshal([]byte(line), &e), line)
		entries = append(entries, e)
	}
	require.Len(t, entries, 2)
	// An entry is written when its connection ends: the two may end in
	// either order.
	slices.SortFunc(entries, func(a, b egress.Entry) int { return strings.Compare(a.Host, b.Host) })
	assert.Equal(t, [2]string{"127.0.0.1", egress.DecisionAllow}, [2]string{entries[0].Host, entries[0].Decision})
	assert.Equal(t, "/hello", entries[0].Path)
	assert.Equal(t, [2]string{"blocked.example", egress.DecisionDeny}, [2]string{entries[1].Host, entries[1].Decision})

	// The isolation record holds the policy, the totals and a passing TR:egress.
	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "egress1", taskrun.AuditRecordName)), &record))
	require.NotNil(t, record.Egress)
	assert.Equal(t, in.Egress, record.Egress.Policy)
	assert.Equal(t, 2, record.Egress.Summary.Connections)
	assert.Equal(t, 1, record.Egress.Summary.Denied)
	for _, f := range record.Findings {
		assert.NotEqual(t, audit.Fail, f.Status, "rule %s: %s", f.ID, f.Reason)
		if f.ID == "TR:egress" {
			assert.Equal(t, audit.Pass, f.Status)
			assert.Contains(t, f.Reason, "/taskrun/.gateway/egress.sock")
		}
	}

	// The credential's value is nowhere in the run's output or the store.
	assert.NotContains(t, stdout, canary)
	require.NoError(t, filepath.WalkDir(storeDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		assert.NotContains(t, string(data), canary, path)
		return err
	}))
}

// A run without a policy is as before: no proxy variables, no proxy socket,
// no egress record, and nothing answers on the relay's port.
func TestRunTaskWithoutEgressPolicyHasNoRouteOut(t *testing.T) {
	h := newHarness(t)
	rec := &controlplanetest.Recorder{}
	in := h.input(rec, "noegress1", "sh", "-c",
		`env | grep -i proxy; ls /taskrun/.gateway 2>&1; cat /proc/net/tcp; echo "== end"`)
	in.HelpersDir = testbin.Dir(t)
	out, err := taskrun.Execute(context.Background(), in)
	require.NoError(t, err)
	stdout := out.Result.OutputStr
	require.Contains(t, stdout, "== end")
	assert.NotContains(t, strings.ToLower(stdout), "proxy=")
	assert.NotContains(t, stdout, egress.SocketName)
	assert.NotContains(t, stdout, relayListening, "nothing listens on the relay's egress port")
	var record audit.Record
	require.NoError(t, json.Unmarshal([]byte(h.runFile(t, "noegress1", taskrun.AuditRecordName)), &record))
	assert.Nil(t, record.Egress)
	_, err = h.Store.OpenRunFile(context.Background(), h.Ref("noegress1"), egress.RecordName)
	require.Error(t, err, "no egress record without a policy")
}

// An egress policy is refused up front when the run cannot honor it.
func TestRunTaskRefusesUnusableEgressPolicy(t *testing.T) {
	h := newHarness(t)
	in := h.input(&controlplanetest.Recorder{}, "badegress1", "true")
	in.Egress = egress.Policy{Rules: []egress.Rule{{Host: "proxy.golang.org"}}}
	_, err := taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrInvalidInput)
	assert.Contains(t, err.Error(), "needs the relay (taskrun-relay) among the helpers")
	assert.Contains(t, err.Error(), "--helpers-dir self", "the error names the fix")

	in.HelpersDir = testbin.Dir(t)
	in.Egress = egress.Policy{Rules: []egress.Rule{{Host: "Not A Host"}}}
	_, err = taskrun.Execute(context.Background(), in)
	require.ErrorIs(t, err, taskrun.ErrInvalidInput)
	require.ErrorIs(t, err, egress.ErrBadPolicy)
}
