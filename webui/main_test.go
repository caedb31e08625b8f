package webui_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testbin"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/uidpool"
	"github.com/taskrun/taskrun/webui"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// EnvRequireChromium makes the browser tests fail instead of skipping when
// Chromium is missing (CI sets it).
const EnvRequireChromium = "TASKRUN_REQUIRE_CHROMIUM"

// Images the runs use (`make images`).
const (
	agentImage = "taskrun/agent:local"
	testImage  = "taskrun/testbox:local"
)

// binding is the function hostile payloads call: the test listens for it,
// so a payload that ran is seen whatever else it does.
const binding = "taskrunPwned"

// browser is the one headless Chromium of the package; nil without one.
var (
	browser     context.Context
	browserErr  string
	stopBrowser context.CancelFunc = func() {}
)

func TestMain(m *testing.M) {
	code := func() int {
		flag.Parse()
		if !testing.Short() {
			startBrowser()
		}
		defer stopBrowser()
		defer testbin.Cleanup()
		code := m.Run()
		if err := closeFixture(); err != nil {
			fmt.Fprintln(os.Stderr, "webui tests:", err)
			code = 1
		}
		return code
	}()
	os.Exit(code)
}

// startBrowser launches Chromium once for the package.
func startBrowser() {
	path, err := exec.LookPath("chromium")
	if err != nil {
		browserErr = "chromium is not installed (scripts/test-setup.sh installs it as root)"
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests run as root
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	if err := chromedp.Do(ctx); err != nil {
		cancelCtx()
		cancelAlloc()
		browserErr = fmt.Sprintf("start chromium: %v", err)
		return
	}
	browser = ctx
	stopBrowser = func() { cancelCtx(); cancelAlloc() }
}

// needBrowser skips (or, with TASKRUN_REQUIRE_CHROMIUM=1, fails) without Chromium.
func needBrowser(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("drives a real browser over real runs")
	}
	if browser == nil {
		if os.Getenv(EnvRequireChromium) == "1" {
			t.Fatalf("%s=1: %s", EnvRequireChromium, browserErr)
		}
		t.Skip(browserErr)
	}
}

// page is one browser tab with the payload binding installed; fired lists
// the payloads that called it.
type page struct {
	ctx   context.Context
	mu    sync.Mutex
	fired []string
}

func newPage(t *testing.T) *page {
	t.Helper()
	needBrowser(t)
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	ctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelT)
	p := &page{ctx: ctx}
	require.NoError(t, chromedp.Do(ctx, chromedp.ExposeFunc(binding, func(_ context.Context, arg []any) (chromedp.Void, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.fired = append(p.fired, fmt.Sprint(arg...))
		return chromedp.Void{}, nil
	})))
	return p
}

// Fired returns the payloads that ran.
func (p *page) Fired() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.fired...)
}

func (p *page) do(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(p.ctx, actions...))
}

// eval evaluates a script expression in the page.
func eval[T any](t *testing.T, p *page, expr string) T {
	t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return v
}

// fixture is the package's store of real runs, shared by its tests.
type fixture struct {
	env     *runtest.Env
	dir     string
	streams *webui.Streams
	src     *webui.StoreSource
	server  *httptest.Server
	// web is what the hostile run's egress policy lets it reach.
	web *httptest.Server
}

var (
	fixOnce sync.Once
	fix     *fixture
	fixErr  error
)

// The runs every test reads; they run once per package.
const (
	demoRun    = "demo1"
	hostileRun = "hostile1"
)

// getFixture runs the shared runs once and serves the interface over them.
func getFixture(t *testing.T) *fixture {
	t.Helper()
	needBrowser(t)
	helpers := testbin.Dir(t)
	fixOnce.Do(func() { fix, fixErr = newFixture(helpers) })
	require.NoError(t, fixErr)
	return fix
}

func newFixture(helpers string) (*fixture, error) {
	dir, err := os.MkdirTemp("", "taskrun-webui-")
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	env, err := runtest.Open(ctx, runtest.Options{Dir: dir, Tenant: "ui" + runtest.RandomID()})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	f := &fixture{env: env, dir: dir, streams: webui.NewStreams(0, 0)}
	f.src = &webui.StoreSource{Store: env.Store, Live: f.streams}
	h, err := webui.New(f.src, webui.Options{})
	if err != nil {
		return f, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	// An unescaped payload: without the interface's headers it runs,
	// which proves the binding detects a payload that runs; with them the
	// Content-Security-Policy stops it.
	control := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, `<!doctype html><title>control</title><img src="x" onerror="`+binding+`('control')"><script>`+binding+`('inline')</script>`)
	})
	mux.Handle("GET /control", control)
	mux.Handle("GET /control-csp", webui.SecureHeaders(control))
	f.server = httptest.NewServer(mux)

	demo := f.input(demoRun, agentImage, helpers)
	ws := filepath.Join(dir, "ws")
	if err := os.CopyFS(ws, examples.DemoWorkspace()); err != nil {
		return f, err
	}
	demo.Task.WorkspaceDir = ws
	demo.Task.Prompt = examples.DemoPrompt
	demo.Command = nil
	demo.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}
	if _, err := taskrun.Execute(ctx, demo); err != nil {
		return f, fmt.Errorf("demo run: %w", err)
	}
	f.web = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "hello from the host")
	}))
	port := f.web.Listener.Addr().(*net.TCPAddr).Port
	hostile := f.input(hostileRun, testImage, helpers, "sh", "-c", fmt.Sprintf("WEB_PORT=%d; %s", port, hostileScript))
	// With an egress policy the run needs a host uid of its own (the
	// proxy's socket is its).
	uids, err := uidpool.New(filepath.Join(dir, "uids"), uidpool.Range{First: 377000, Last: 377099})
	if err != nil {
		return f, err
	}
	hostile.UIDs = uids
	hostile.Egress = egress.Policy{Rules: []egress.Rule{{Host: "127.0.0.1", Port: port}}}
	_, _ = taskrun.Execute(ctx, hostile) // it fails on purpose (exit 3)
	return f, nil
}

// input is a run in the fixture's store, streaming to its Streams.
func (f *fixture) input(runID, image, helpers string, cmd ...string) taskrun.RunTaskInput {
	in := f.env.Input(runID, image, cmd...)
	in.Task.Prompt = "show the web interface something"
	in.Updater = &controlplanetest.Recorder{}
	in.StreamSender = f.streams
	in.Policy = sandbox.DefaultPolicy()
	in.HelpersDir = helpers
	in.Logger = slog.New(slog.DiscardHandler)
	return in
}

// closeFixture releases the fixture; containers left behind are an error.
func closeFixture() error {
	if fix == nil {
		return nil
	}
	for _, s := range []*httptest.Server{fix.server, fix.web} {
		if s != nil {
			s.Close()
		}
	}
	ctx := context.Background()
	var errs []error
	if left, err := fix.env.Containers(ctx); err != nil || len(left) > 0 {
		errs = append(errs, fmt.Errorf("containers left behind: %v (%v)", left, err))
	}
	errs = append(errs, fix.env.RemoveContainers(ctx), fix.env.Close(), os.RemoveAll(fix.dir))
	return errors.Join(errs...)
}

// url is the address of a page of the interface.
func (f *fixture) url(path string) string { return f.server.URL + path }
