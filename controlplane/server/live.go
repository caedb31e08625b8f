package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/daemon"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workerclient"
)

// The live API of a keep-alive run (controlplane.SubmitRequest.KeepAlive)
// is the daemon's (package daemon: processes, exec, files, ports, usage),
// served by the worker that holds the run (daemon.Server.LiveHandler) and
// proxied here, to the run's tenant only: another tenant's call is 404,
// as a run that does not exist.

// liveRoutes are the live API's patterns the control plane proxies.
var liveRoutes = []string{
	"POST " + daemon.PathExec,
	"POST " + daemon.PathProcesses,
	"GET " + daemon.PathProcesses,
	"GET " + daemon.PathProcess,
	"GET " + daemon.PathProcessOutput,
	"POST " + daemon.PathProcessStdin,
	"POST " + daemon.PathProcessSignal,
	"GET " + daemon.PathUsage,
	"GET " + daemon.PathFiles,
	"PUT " + daemon.PathFiles,
	"DELETE " + daemon.PathFiles,
	"GET " + daemon.PathPorts,
	daemon.PathPort,
}

// liveEndpoints are the workers' live APIs by worker ID, as their lease
// requests last named them; memory only.
type liveEndpoints struct {
	mu sync.Mutex
	m  map[string]workerclient.LiveEndpoint
}

func (l *liveEndpoints) set(worker string, e *workerclient.LiveEndpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]workerclient.LiveEndpoint{}
	}
	if e == nil {
		delete(l.m, worker)
		return
	}
	l.m[worker] = *e
}

func (l *liveEndpoints) get(worker string) (workerclient.LiveEndpoint, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[worker]
	return e, ok
}

// checkLive refuses ports on a run that is not live, a bad port
// declaration and a negative idle timeout.
func checkLive(req *controlplane.SubmitRequest) error {
	switch {
	case len(req.Ports) > 0 && !req.KeepAlive:
		return errors.New("ports: only a live run (keep_alive) declares ports")
	case req.IdleTimeoutMillis < 0:
		return errors.New("idle_timeout_ms cannot be negative")
	case req.IdleTimeoutMillis > 0 && !req.KeepAlive:
		return errors.New("idle_timeout_ms: only a live run (keep_alive) has one")
	}
	return daemon.CheckPorts(req.Ports)
}

// handleLive proxies a call on the live API of the caller's keep-alive
// run to the worker that holds it.
func (s *Server) handleLive(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	if !run.Spec.KeepAlive {
		writeError(w, http.StatusConflict, fmt.Sprintf("run %s is not a live run: submit it with keep_alive", run.ID))
		return
	}
	if run.Status != model.StatusRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("run %s is %s, not live", run.ID, run.Status))
		return
	}
	ep, ok := s.live.get(run.WorkerID)
	if !ok {
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("run %s: its worker serves no live API to this control plane (worker --live-url)", run.ID))
		return
	}
	base, err := url.Parse(ep.URL)
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Sprintf("run %s: its worker's live URL: %v", run.ID, err))
		return
	}
	caller := "user " + user(r) + " through taskrun serve"
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			pr.Out.URL.Path = strings.TrimSuffix(base.Path, "/") + r.URL.Path
			pr.Out.URL.RawPath = ""
			if r.URL.RawPath != "" {
				pr.Out.URL.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + r.URL.RawPath
			}
			pr.Out.Host = base.Host
			// The user's credentials stay here: the worker hears the
			// control plane's secret and who called.
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Set("Authorization", "Bearer "+ep.Secret)
			pr.Out.Header.Set(daemon.CallerHeader, caller)
		},
		Transport:     s.liveTransport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			s.cfg.Log.Warn("live API call to a worker failed", "run", run.ID, "worker", run.WorkerID, "err", err)
			writeError(w, http.StatusBadGateway, fmt.Sprintf("run %s: its worker did not answer", run.ID))
		},
	}
	proxy.ServeHTTP(w, r)
}

// LiveUsage is a live run's resource usage at its last sample, asked of
// the worker that holds it: nil when the run is not a RUNNING live run or
// has no sample yet.
func (s *Server) LiveUsage(ctx context.Context, run controlplane.Run) (*sandbox.Usage, error) {
	if !run.Spec.KeepAlive || run.Status != model.StatusRunning {
		return nil, nil
	}
	ep, ok := s.live.get(run.WorkerID)
	if !ok {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, liveUsageTimeout)
	defer cancel()
	u := strings.TrimSuffix(ep.URL, "/") + "/v1/runs/" + url.PathEscape(run.ID) + "/usage"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+ep.Secret)
	resp, err := (&http.Client{Transport: s.liveTransport}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("run %s: usage: %w", run.ID, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusConflict, http.StatusNotFound:
		return nil, nil
	default:
		return nil, fmt.Errorf("run %s: usage: its worker answered %s", run.ID, resp.Status)
	}
	var out sandbox.Usage
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return nil, fmt.Errorf("run %s: usage: %w", run.ID, err)
	}
	return &out, nil
}

// liveUsageTimeout bounds asking a worker for a live run's usage.
const liveUsageTimeout = 3 * time.Second
