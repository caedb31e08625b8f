package webui_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/webui"
)

const (
	registryImage = "127.0.0.1:27500/nu/age"
	imageHex      = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	failReason    = `image pull failed: <img src=x onerror=taskrunPwned("reason")>`
)

// storeForDisplay holds one failed run pulled from a registry, with limits
// as a run index record stores them (JSON numbers), an isolation record
// whose egress policy injects a granted credential, and its egress record.
func storeForDisplay(t *testing.T) *persist.Store {
	t.Helper()
	ctx := context.Background()
	st, err := persist.Open(ctx, "mem://")
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	ref := persist.RunRef{UserID: "u1", ConversationID: "c1", TaskID: "t1", RunID: "reg1"}
	rec := audit.Record{Version: audit.RecordVersion, Egress: &audit.EgressRecord{
		Policy: egress.Policy{
			Rules: []egress.Rule{{Host: "api.github.com"}},
			Credentials: []egress.Credential{{ID: "github-ci", Host: "api.github.com", Header: "Authorization",
				ValueEnv: "GH_SECRET_ENV_NAME", Format: "Bearer %s"}},
		},
		Summary: egress.Summary{Connections: 1, Allowed: 1},
	}}
	raw, err := json.Marshal(rec)
	require.NoError(t, err)
	auditInfo, err := st.PutRunFile(ctx, ref, "audit.json", strings.NewReader(string(raw)), "application/json")
	require.NoError(t, err)
	line, err := json.Marshal(egress.Entry{Time: time.Now(), Kind: "https", Host: "api.github.com", Port: 443, Method: "GET", Path: "/user",
		Decision: egress.DecisionAllow, Rule: "api.github.com", Status: 200, Credential: "Authorization"})
	require.NoError(t, err)
	_, err = st.PutRunFile(ctx, ref, egress.RecordName, strings.NewReader(string(line)+"\n"), "application/jsonl")
	require.NoError(t, err)
	// Limits go through JSON, as the index stores them: 2 GiB becomes the
	// float64 2.147483648e+09.
	var limits map[string]any
	require.NoError(t, json.Unmarshal([]byte(`{"memory_bytes":2147483648,"nano_cpus":1500000000,"pids":256,"disk_bytes":0,"timeout":"10m0s"}`), &limits))
	exit := 1
	idx := runindex.Record{RunID: "reg1", UserID: "u1", ConversationID: "c1", TaskID: "t1", Status: model.StatusFailed, Reason: failReason,
		Start: time.Now().Add(-time.Minute).UTC(), End: time.Now().UTC(), ExitCode: &exit,
		Image: registryImage, ImageDigest: registryImage + "@sha256:" + imageHex, Limits: limits,
		Keys: runindex.Keys{Audit: auditInfo.Key}}
	_, err = runindex.Put(ctx, st, &idx)
	require.NoError(t, err)
	return st
}

// A registry image shows its name and a digest one can read, with the full
// pinned reference in the title and on the run's page; the run list has a
// failure-reason column (escaped); limits are in human units; the egress
// view names the credential injected for each host, never its value.
func TestDisplayOfImagesReasonsLimitsCredentials(t *testing.T) {
	needBrowser(t)
	h, err := webui.New(&webui.StoreSource{Store: storeForDisplay(t)}, webui.Options{})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	p := newPage(t)

	p.do(t, chromedp.Navigate(srv.URL+"/"))
	row := `tr[data-run="reg1"]`
	assert.Equal(t, registryImage, textOf(t, p, row+" .image-name"))
	assert.Equal(t, "sha256:"+imageHex[:12], textOf(t, p, row+" .image-digest"))
	assert.Equal(t, registryImage+"@sha256:"+imageHex, eval[string](t, p, `document.querySelector('`+row+` td.image').title`))
	assert.Equal(t, failReason, textOf(t, p, row+" td.reason"), "the reason, as text")
	headers := eval[[]string](t, p, `[...document.querySelectorAll('#runs thead th')].map(th => th.textContent)`)
	assert.Contains(t, headers, "Failure reason")

	p.do(t, chromedp.Navigate(srv.URL+"/runs/reg1"))
	assert.Contains(t, textOf(t, p, "#image .image-full"), registryImage+"@sha256:"+imageHex)
	creds := textOf(t, p, "#credentials")
	assert.Contains(t, creds, "api.github.com")
	assert.Contains(t, creds, "Authorization")
	assert.Contains(t, creds, "github-ci")
	egressText := textOf(t, p, "#egress")
	assert.Contains(t, egressText, "Authorization (github-ci)", "the connection names the credential injected")
	assert.NotContains(t, egressText, "GH_SECRET_ENV_NAME", "nothing of where the value comes from")
	assert.NotContains(t, egressText, "Bearer")

	p.do(t, chromedp.Navigate(srv.URL+"/runs/reg1/isolation"))
	limit := func(name string) string { return textOf(t, p, `#limits tr[data-limit="`+name+`"] td:nth-child(2)`) }
	assert.Equal(t, "2.0 GiB", limit("memory_bytes"))
	assert.Equal(t, "1.5 cores", limit("nano_cpus"))
	assert.Equal(t, "256", limit("pids"))
	assert.Equal(t, "unlimited", limit("disk_bytes"))
	assert.Equal(t, "10m0s", limit("timeout"))
	assert.NotContains(t, textOf(t, p, "#policy"), "e+0")
	assert.Empty(t, p.Fired(), "no payload ran")
}
