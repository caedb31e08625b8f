package webui_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/timings"
)

// hostileScript is an agent that writes markup, script URLs and terminal
// escapes everywhere the interface shows: stdout, file names, file contents
// (the diff), artifact names and contents, and its trace.
const hostileScript = `
printf '<script>taskrunPwned("stdout-script")</script>\n'
printf '<img src=x onerror=taskrunPwned("stdout-img")>\n'
printf '<a id=jslink href="javascript:taskrunPwned(1)">click</a>\n'
printf '\033]0;pwned-title\007\033[31mred\033[0m \033[2Jcleared\n'
cd /taskrun/home
printf '<script>taskrunPwned("diff")</script>\n<img src=x onerror=taskrunPwned("diff-img")>\n' > '<img src=x onerror=taskrunPwned("name")>.txt'
printf 'x\n' > "$(printf 'esc\033[31mname.txt')"
printf '<script>taskrunPwned("artifact")</script>' > '/taskrun/artifacts/<svg onload=taskrunPwned("art")>.html'
wget -q -O - "http://127.0.0.1:$WEB_PORT/<script>taskrunPwned(\"egress\")</script>"; echo
wget -q -O - "http://blocked.example/" 2>&1
mkdir -p /taskrun/global/traces/s1
printf '{"type":"<script>taskrunPwned(\\"trace\\")</script>","message":"<img src=x onerror=taskrunPwned(1)>\\u001b]0;t\\u0007"}\n' > /taskrun/global/traces/s1/rt_hostile1.jsonl
exit 3
`

// textOf waits for sel and returns its text content. Query and read are one
// script: live pages replace their rows, so a node found by one DevTools
// call may be gone by the next.
func textOf(t *testing.T, p *page, sel string) string {
	t.Helper()
	var got *string
	require.Eventually(t, func() bool {
		s, err := chromedp.Run(p.ctx, chromedp.Evaluate[*string](`(function(){var e=document.querySelector(`+jsString(sel)+`);return e?e.textContent:null})()`))
		got = s
		return err == nil && s != nil
	}, time.Minute, 50*time.Millisecond, "%s never appeared", sel)
	return *got
}

// count is the number of elements matching sel.
func count(t *testing.T, p *page, sel string) int {
	t.Helper()
	return eval[int](t, p, `document.querySelectorAll(`+jsString(sel)+`).length`)
}

func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// waitText polls sel's text until it contains want.
func waitText(t *testing.T, p *page, sel, want string) string {
	t.Helper()
	var got string
	require.Eventually(t, func() bool {
		got, _ = chromedp.Run(p.ctx, chromedp.Evaluate[string](`(document.querySelector(`+jsString(sel)+`)||{}).textContent||""`))
		return strings.Contains(got, want)
	}, time.Minute, 100*time.Millisecond, "%s never showed %q; it shows %q", sel, want, got)
	return got
}

// The list shows the stored runs, newest first, with their status, and the
// status filter narrows it.
func TestRunListShowsRunsAndFilters(t *testing.T) {
	f := getFixture(t)
	p := newPage(t)
	p.do(t, chromedp.Navigate(f.url("/")))
	demo := textOf(t, p, `tr[data-run="`+demoRun+`"]`)
	assert.Contains(t, demo, "SUCCEEDED")
	assert.Contains(t, demo, "sha256:", "the image digest")
	assert.Contains(t, demo, "runc")
	assert.Contains(t, textOf(t, p, `tr[data-run="`+hostileRun+`"]`), "FAILED")
	order := eval[[]string](t, p, `[...document.querySelectorAll('tr[data-run]')].map(r => r.dataset.run)`)
	require.GreaterOrEqual(t, len(order), 2)
	assert.Less(t, indexOf(order, hostileRun), indexOf(order, demoRun), "newest first")

	p.do(t, chromedp.Navigate(f.url("/?status=FAILED&tenant="+f.env.Tenant)))
	assert.Contains(t, textOf(t, p, `tr[data-run="`+hostileRun+`"]`), "FAILED")
	assert.Zero(t, count(t, p, `tr[data-run="`+demoRun+`"]`), "the filter leaves out the succeeded run")
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// A running run appears in the open list by itself, and its page shows its
// output as the run writes it, then says when it ended.
func TestLiveRunAppearsAndStreams(t *testing.T) {
	f := getFixture(t)
	const runID = "live1"
	list := newPage(t)
	list.do(t, chromedp.Navigate(f.url("/")), chromedp.WaitVisible(chromedp.CSS("#live-note")))

	in := f.input(runID, testImage, testbin.Dir(t), "sh", "-c", `
echo 'first-line <img src=x onerror=taskrunPwned("live")>'
printf '\033[31mred\033[0m\n'
while [ ! -e /taskrun/home/go ]; do sleep 0.1; done
echo second-line`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, runErr = taskrun.Execute(ctx, in)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	waitText(t, list, `tr[data-run="`+runID+`"]`, "RUNNING")

	p := newPage(t)
	p.do(t, chromedp.Navigate(f.url("/runs/"+runID)))
	out := waitText(t, p, "#output", "first-line")
	assert.NotContains(t, out, "second-line", "the run has not written it yet")
	assert.Contains(t, out, `<img src=x onerror=taskrunPwned("live")>`, "markup arrives as text")

	require.NoError(t, os.WriteFile(filepath.Join(f.env.RunDir(runID), "home", "go"), nil, 0o644))
	out = waitText(t, p, "#output", "second-line")
	assert.Contains(t, out, "^[[31mred", "terminal escapes are shown, not interpreted")
	assert.NotContains(t, out, "\x1b")
	p.do(t, chromedp.WaitReady(chromedp.CSS(`pre[data-ended="true"]`)))
	wg.Wait()
	require.NoError(t, runErr)
	waitText(t, list, `tr[data-run="`+runID+`"]`, "SUCCEEDED")
	assert.Empty(t, p.Fired(), "no payload ran")
	assert.Empty(t, list.Fired(), "no payload ran")
}

// A finished run's page renders its change set as a diff, its artifacts, its
// model exchanges and trace; its isolation page the record's rules and both
// views of the sandbox.
func TestRunPageRendersDiffAndIsolation(t *testing.T) {
	f := getFixture(t)
	p := newPage(t)
	p.do(t, chromedp.Navigate(f.url("/runs/"+demoRun)))
	assert.Contains(t, textOf(t, p, "#run-status"), "SUCCEEDED")
	assert.Positive(t, count(t, p, "#diff .dl.add"), "added lines")
	assert.Positive(t, count(t, p, "#diff .diff-file"))
	assert.Contains(t, textOf(t, p, "#artifacts"), "report.md")
	href := eval[string](t, p, `document.querySelector('#artifacts a[download]').getAttribute('href')`)
	assert.Contains(t, href, "/runs/"+demoRun+"/artifacts/report.md")
	assert.Positive(t, count(t, p, "#gateway ol.timeline li"), "model exchanges")
	assert.Positive(t, count(t, p, "#trace ol.timeline li"), "trace entries")
	assert.NotEmpty(t, strings.TrimSpace(textOf(t, p, "#output")))
	// The phases the executor timed, from the run's index record.
	for _, phase := range []string{timings.Prepare, timings.Launch, timings.LiveAudit, timings.Wait, timings.Collect} {
		assert.Equal(t, 1, count(t, p, `#phases tr[data-phase="`+phase+`"]`), "phase %s", phase)
	}
	assert.NotContains(t, textOf(t, p, "#phases"), "no phase timings")

	p.do(t, chromedp.Navigate(f.url("/runs/"+demoRun+"/isolation")))
	rows := count(t, p, "#findings tbody tr")
	assert.Equal(t, len(audit.RuleIDs())+1, rows, "one row per rule, and the self-check's")
	assert.Zero(t, count(t, p, "#findings tr.f-fail"), "the run passed every rule")
	assert.Contains(t, textOf(t, p, "#findings"), "CapDrop contains ALL", "the evidence each rule read")
	assert.Positive(t, count(t, p, "#views tbody tr"), "the self-check's view next to the host's")
	assert.Zero(t, count(t, p, "#views tr.agree-no"))
	assert.Contains(t, textOf(t, p, "#policy"), "memory_bytes")

	p.do(t, chromedp.Navigate(f.url("/rules")))
	assert.Equal(t, len(audit.RuleIDs()), count(t, p, "table.rules tbody tr"))
	assert.Contains(t, textOf(t, p, "table.rules"), "fork bomb")
}

// Markup, script URLs and terminal escapes an agent writes into stdout, file
// names, the diff, artifact names and its trace are shown as text: no
// payload runs, while the control page proves a payload that runs is seen.
func TestHostileRunCannotRunScript(t *testing.T) {
	f := getFixture(t)

	control := newPage(t)
	control.do(t, chromedp.Navigate(f.url("/control")))
	require.Eventually(t, func() bool { return len(control.Fired()) == 2 }, 30*time.Second, 50*time.Millisecond,
		"the control payloads never both reached the binding (%v): the detection does not work", control.Fired())
	assert.ElementsMatch(t, []string{"control", "inline"}, control.Fired())

	// The same payloads under the interface's headers: the policy blocks
	// them. The inline script would have run while the page was parsed; the
	// image's error handler by the time the image is complete.
	csp := newPage(t)
	csp.do(t, chromedp.Navigate(f.url("/control-csp")))
	require.Eventually(t, func() bool {
		done, err := chromedp.Run(csp.ctx, chromedp.Evaluate[bool](`document.images.length == 1 && document.images[0].complete`))
		return err == nil && done
	}, 30*time.Second, 50*time.Millisecond, "the control image never finished loading")
	time.Sleep(100 * time.Millisecond) // let the error event's task run
	assert.Empty(t, csp.Fired(), "the Content-Security-Policy let an inline payload run")

	p := newPage(t)
	for _, path := range []string{"/", "/runs/" + hostileRun, "/runs/" + hostileRun + "/isolation"} {
		p.do(t, chromedp.Navigate(f.url(path)), chromedp.WaitReady(chromedp.CSS("main")))
		assert.Zero(t, count(t, p, `a[href^="javascript:"]`), path)
		assert.Zero(t, count(t, p, "img, svg, iframe, object, embed"), path)
		assert.Equal(t, 1, count(t, p, "script"), "%s: only the page's own script", path)
	}
	p.do(t, chromedp.Navigate(f.url("/runs/"+hostileRun)))
	out := textOf(t, p, "#output")
	assert.Contains(t, out, `<script>taskrunPwned("stdout-script")</script>`, "the payload is shown as text")
	assert.Contains(t, out, `<a id=jslink href="javascript:taskrunPwned(1)">click</a>`)
	assert.Contains(t, out, "^[]0;pwned-title^G^[[31mred")
	assert.NotContains(t, out, "\x1b")
	title, err := chromedp.Run(p.ctx, chromedp.Title())
	require.NoError(t, err)
	assert.Equal(t, "Run "+hostileRun+" · taskrun", title, "an OSC title sequence changes nothing")
	diff := textOf(t, p, "#changes")
	assert.Contains(t, diff, `<script>taskrunPwned("diff")</script>`)
	assert.Contains(t, diff, `<img src=x onerror=taskrunPwned("name")>.txt`)
	assert.NotContains(t, diff, "\x1b")
	assert.Contains(t, textOf(t, p, "#artifacts"), `<svg onload=taskrunPwned("art")>.html`)
	assert.Contains(t, textOf(t, p, "#trace"), `<script>taskrunPwned(\"trace\")</script>`)

	egressText := textOf(t, p, "#egress")
	assert.Contains(t, egressText, "1 refused", "the policy's totals")
	assert.Contains(t, egressText, "blocked.example:80")
	assert.Contains(t, egressText, "no rule allows")
	assert.Positive(t, count(t, p, "#egress tr.dec-allow"), "the allowed request")
	assert.Positive(t, count(t, p, "#egress tr.dec-deny"), "the refused one")

	// Following every link on the page runs nothing either.
	links := eval[[]string](t, p, `[...document.querySelectorAll('a[href]')].map(a => a.href)`)
	for _, l := range links {
		assert.True(t, strings.HasPrefix(l, f.server.URL), "link %q leaves the interface", l)
	}
	time.Sleep(200 * time.Millisecond) // let any late handler (onerror, onload) fire
	assert.Empty(t, p.Fired(), "a hostile payload ran")

	// The artifact is a download, never a page.
	art := eval[string](t, p, `document.querySelector('#artifacts a[download]').href`)
	resp, err := http.Get(art)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"))
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment"), resp.Header.Get("Content-Disposition"))
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "sandbox")
}
