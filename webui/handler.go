package webui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/changeset"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/termsafe"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// ContentSecurityPolicy is sent with every page: no inline script or style,
// no eval, nothing loaded from elsewhere, no framing.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// downloadPolicy is sent with downloads: were one rendered anyway, it could
// run nothing.
const downloadPolicy = "default-src 'none'; sandbox; frame-ancestors 'none'"

// Bounds of the handler's live connections.
const (
	// DefaultMaxStreams caps concurrent server-sent event connections.
	DefaultMaxStreams = 256
	// DefaultMaxStreamsPerTenant caps one tenant's share of them, so that
	// one tenant cannot hold every live connection.
	DefaultMaxStreamsPerTenant = 32
	// outputChunk is the most output one event carries.
	outputChunk = 64 << 10
	// listPoll is how often the live run list looks for changes.
	listPoll = time.Second
	// maxLivePerPage caps what a live output page receives before it tells
	// the reader to download the log instead.
	maxLivePerPage = 8 << 20
)

// Options configure a Handler.
type Options struct {
	// Base is the path the handler is mounted at, e.g. "/ui" ("" for /).
	// Requests must reach the handler with the base still in their path.
	Base string
	// Logger receives errors reading the source; discarded when nil.
	Logger *slog.Logger
	// MaxStreams caps concurrent live connections (<= 0: DefaultMaxStreams).
	MaxStreams int
	// MaxStreamsPerTenant caps one tenant's concurrent live connections
	// when Tenant is set (<= 0: DefaultMaxStreamsPerTenant); requests
	// without a tenant share one such share. Past it a request gets 429.
	MaxStreamsPerTenant int
	// Tenant, when set, names the tenant a request reads as: it sees only
	// that tenant's runs (another tenant's run is not found) and only that
	// tenant's leases on the hosts page. ok false: the request sees no run.
	Tenant func(r *http.Request) (tenant string, ok bool)
	// AttestKeys are the public keys a run's attestation is checked with on
	// its page, when the Source is a BlobSource. None: the page names the
	// envelope's signer and says it is not checked.
	AttestKeys []*attest.Verifier
	// Actions, when set, let a signed-in user submit tasks, resume and cancel
	// their own runs from the interface (forms protected against CSRF);
	// nil: the interface is read-only.
	Actions Actions
}

// Handler serves the web interface over a Source.
type Handler struct {
	src   Source
	base  string
	log   *slog.Logger
	mux   *http.ServeMux
	pages map[string]*template.Template
	slots chan struct{}
	// perTenant caps each tenant's live connections; live counts them.
	perTenant int
	liveMu    sync.Mutex
	live      map[string]int
	// tenant scopes requests (Options.Tenant).
	tenant func(*http.Request) (string, bool)
	// attestKeys check attestations (Options.AttestKeys).
	attestKeys []*attest.Verifier
	// actions carry out forms (Options.Actions); nil: read-only.
	actions Actions
}

// New returns a Handler reading src.
func New(src Source, opts Options) (*Handler, error) {
	base := strings.TrimSuffix(opts.Base, "/")
	if base != "" && (!strings.HasPrefix(base, "/") || strings.ContainsAny(base, "{}?#") || path.Clean(base) != base) {
		return nil, fmt.Errorf("webui: base %q must be a clean absolute path such as /ui", opts.Base)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.MaxStreamsPerTenant <= 0 {
		opts.MaxStreamsPerTenant = DefaultMaxStreamsPerTenant
	}
	h := &Handler{src: src, base: base, log: opts.Logger, mux: http.NewServeMux(), pages: map[string]*template.Template{}, slots: make(chan struct{}, opts.MaxStreams), tenant: opts.Tenant,
		perTenant: opts.MaxStreamsPerTenant, live: map[string]int{}, attestKeys: slices.Clone(opts.AttestKeys), actions: opts.Actions}
	funcs := template.FuncMap{
		"base":    func() string { return base },
		"actions": func() bool { return opts.Actions != nil },
		"t":       termsafe.String,
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"ms": func(ms int64) string {
			if ms <= 0 {
				return "—"
			}
			return (time.Duration(ms) * time.Millisecond).Round(time.Millisecond).String()
		},
		"dur":    func(d time.Duration) string { return d.Round(time.Millisecond).String() },
		"size":   humanSize,
		"deref":  func(p *int) string { return map[bool]string{true: "—", false: ""}[p == nil] + derefInt(p) },
		"short":  func(s string) string { return shortDigest(s) },
		"image":  func(r Run) imageView { return imageOf(r.Image, r.ImageDigest) },
		"limits": limitsOf,
		"lower":  strings.ToLower,
		"q":      url.QueryEscape,
		"pathq":  url.PathEscape,
		"artpath": func(p string) string {
			elems := strings.Split(p, "/")
			for i, e := range elems {
				elems[i] = url.PathEscape(e)
			}
			return strings.Join(elems, "/")
		},
	}
	for _, page := range []string{"runs.html", "run.html", "isolation.html", "rules.html", "hosts.html", "error.html", "submit.html"} {
		t, err := template.New(page).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/rows.html", "templates/"+page)
		if err != nil {
			return nil, fmt.Errorf("webui: parse %s: %w", page, err)
		}
		h.pages[page] = t
	}
	assets, err := fs.Sub(assetFS, "assets")
	if err != nil {
		return nil, err
	}
	b := base
	h.mux.Handle("GET "+b+"/assets/", http.StripPrefix(b+"/assets/", http.FileServerFS(assets)))
	h.mux.HandleFunc("GET "+b+"/{$}", h.runs)
	h.mux.HandleFunc("GET "+b+"/events/runs", h.runEvents)
	h.mux.HandleFunc("GET "+b+"/runs/{id}", h.run)
	h.mux.HandleFunc("GET "+b+"/runs/{id}/output", h.outputEvents)
	h.mux.HandleFunc("GET "+b+"/runs/{id}/log", h.download(ObjectLog, "output.log"))
	h.mux.HandleFunc("GET "+b+"/runs/{id}/patch", h.download(ObjectPatch, "changes.patch"))
	h.mux.HandleFunc("GET "+b+"/runs/{id}/trace", h.download(ObjectTrace, "trace.jsonl"))
	h.mux.HandleFunc("GET "+b+"/runs/{id}/artifacts/{path...}", h.artifact)
	h.mux.HandleFunc("GET "+b+"/runs/{id}/isolation", h.isolation)
	h.mux.HandleFunc("GET "+b+"/rules", h.rules)
	h.mux.HandleFunc("GET "+b+"/hosts", h.hosts)
	if h.actions != nil {
		h.mux.HandleFunc("GET "+b+"/submit", h.submitForm)
		h.mux.HandleFunc("POST "+b+"/submit", h.submit)
		h.mux.HandleFunc("POST "+b+"/runs/{id}/cancel", h.cancel)
		h.mux.HandleFunc("POST "+b+"/runs/{id}/resume", h.resume)
		h.mux.HandleFunc("POST "+b+"/runs/{id}/fork", h.fork)
	}
	return h, nil
}

// ServeHTTP serves the interface, with SecureHeaders.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecureHeaders(w.Header())
	h.mux.ServeHTTP(w, r)
}

// SecureHeaders sets the interface's security headers on every answer of
// next: the Content-Security-Policy (no inline script, no eval, nothing from
// elsewhere, no framing), nosniff, no referrer, and no caching.
func SecureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setSecureHeaders(w.Header())
		next.ServeHTTP(w, r)
	})
}

func setSecureHeaders(hd http.Header) {
	hd.Set("Content-Security-Policy", ContentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with the interface's own forms.
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
}

func derefInt(p *int) string {
	if p == nil {
		return ""
	}
	return strconv.Itoa(*p)
}

func shortDigest(s string) string {
	if alg, hex, ok := strings.Cut(s, ":"); ok && len(hex) > 12 {
		return alg + ":" + hex[:12]
	}
	if len(s) > 19 {
		return s[:19]
	}
	return s
}

func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// render writes one page.
func (h *Handler) render(w http.ResponseWriter, status int, page string, data any) {
	var buf bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.log.Error("render page", "page", page, "err", err)
		http.Error(w, "page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail answers an error reading the source.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	msg := "the run store could not be read; see the server's log"
	switch {
	case errors.Is(err, ErrNotFound):
		status, msg = http.StatusNotFound, err.Error()
	case errors.Is(err, ErrNoObject):
		status, msg = http.StatusNotFound, err.Error()
	case errors.Is(err, model.ErrInvalidID):
		status, msg = http.StatusBadRequest, err.Error()
	case errors.Is(err, context.Canceled):
		return
	default:
		h.log.Error("read runs", "path", r.URL.Path, "err", err)
	}
	h.render(w, status, "error.html", map[string]any{"Title": http.StatusText(status), "Message": msg})
}

// filterOf reads the run list's filter from the query.
func filterOf(r *http.Request) (Filter, error) {
	q := r.URL.Query()
	f := Filter{Tenant: q.Get("tenant"), Task: q.Get("task"), Status: model.RunStatus(strings.ToUpper(q.Get("status")))}
	if f.Tenant != "" {
		if err := model.ValidateID("user", f.Tenant); err != nil {
			return f, err
		}
	}
	if f.Task != "" {
		if err := model.ValidateID("task", f.Task); err != nil {
			return f, err
		}
	}
	switch f.Status {
	case "", model.StatusQueued, model.StatusRunning, model.StatusPaused, model.StatusSucceeded, model.StatusFailed, model.StatusCancelled:
	default:
		return f, fmt.Errorf("%w: status %q: use QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED", model.ErrInvalidID, q.Get("status"))
	}
	return f, nil
}

// runsPage is the data of the run list.
type runsPage struct {
	Title    string
	Statuses []string
	Filter   Filter
	Query    string
	Runs     []Run
}

func (h *Handler) runs(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	runs, err := h.source(r).Runs(r.Context(), f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, http.StatusOK, "runs.html", runsPage{Title: "Runs", Statuses: []string{"QUEUED", "RUNNING", "PAUSED", "SUCCEEDED", "FAILED", "CANCELLED"}, Filter: f, Query: r.URL.RawQuery, Runs: runs})
}

// acquire takes a live connection slot for r, or answers 429 when r's
// tenant holds its share of them (Options.MaxStreamsPerTenant) and 503 when
// all are taken. release gives the slot back.
func (h *Handler) acquire(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	tenant, scoped := "", h.tenant != nil
	if scoped {
		tenant, _ = h.tenant(r)
		h.liveMu.Lock()
		if h.live[tenant] >= h.perTenant {
			h.liveMu.Unlock()
			w.Header().Set("Retry-After", "5")
			http.Error(w, fmt.Sprintf("this tenant has %d live connections open, its share; close one and try again", h.perTenant), http.StatusTooManyRequests)
			return nil, false
		}
		h.live[tenant]++
		h.liveMu.Unlock()
	}
	untrack := func() {
		if !scoped {
			return
		}
		h.liveMu.Lock()
		if h.live[tenant]--; h.live[tenant] == 0 {
			delete(h.live, tenant)
		}
		h.liveMu.Unlock()
	}
	select {
	case h.slots <- struct{}{}:
		return func() { <-h.slots; untrack() }, true
	default:
		untrack()
		w.Header().Set("Retry-After", "5")
		http.Error(w, "too many live connections; try again shortly", http.StatusServiceUnavailable)
		return nil, false
	}
}

// sse starts a server-sent event answer.
func sse(w http.ResponseWriter) (send func(event, id string, data any) error, ok bool) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil, false // the writer cannot stream
	}
	return func(event, id string, data any) error {
		// JSON has no raw newline, so one data line carries the event.
		raw, err := json.Marshal(data)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "event: %s\n", event)
		if id != "" {
			fmt.Fprintf(&b, "id: %s\n", id)
		}
		fmt.Fprintf(&b, "data: %s\n\n", raw)
		if _, err := w.Write(b.Bytes()); err != nil {
			return err
		}
		return rc.Flush()
	}, true
}

// runEvents sends the run list's rows whenever they change.
func (h *Handler) runEvents(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	release, ok := h.acquire(w, r)
	if !ok {
		return
	}
	defer release()
	send, ok := sse(w)
	if !ok {
		return
	}
	ctx := r.Context()
	src := h.source(r)
	var last [32]byte
	tick := time.NewTicker(listPoll)
	defer tick.Stop()
	for {
		runs, err := src.Runs(ctx, f)
		if err == nil {
			var buf bytes.Buffer
			if err := h.pages["runs.html"].ExecuteTemplate(&buf, "rows", runs); err != nil {
				h.log.Error("render rows", "err", err)
				return
			}
			if sum := sha256.Sum256(buf.Bytes()); sum != last {
				last = sum
				if send("rows", "", buf.String()) != nil {
					return
				}
			}
		} else if ctx.Err() == nil {
			h.log.Warn("live run list", "err", err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// outputEvent is one piece of output as the page receives it: escaped for a
// terminal, so no control character reaches the page.
type outputEvent struct {
	Offset int64  `json:"o"`
	Text   string `json:"d"`
}

// outputEvents follows a run's output from ?from= or Last-Event-ID.
func (h *Handler) outputEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := model.ValidateID("run", id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	from := r.Header.Get("Last-Event-ID")
	if from == "" {
		from = r.URL.Query().Get("from")
	}
	var off int64
	if from != "" {
		var err error
		if off, err = strconv.ParseInt(from, 10, 64); err != nil || off < 0 {
			http.Error(w, "from must be a byte offset", http.StatusBadRequest)
			return
		}
	}
	ctx := r.Context()
	src := h.source(r)
	if _, err := src.Run(ctx, id); err != nil {
		h.fail(w, r, err)
		return
	}
	release, ok := h.acquire(w, r)
	if !ok {
		return
	}
	defer release()
	send, ok := sse(w)
	if !ok {
		return
	}
	var text bytes.Buffer
	esc := termsafe.NewWriter(&text)
	sent := int64(0)
	for {
		c, err := src.FollowOutput(ctx, id, off, outputChunk)
		if err != nil {
			if ctx.Err() == nil {
				_ = send("failed", "", err.Error())
			}
			return
		}
		text.Reset()
		_, _ = esc.Write(c.Data)
		if c.Ended {
			_ = esc.Flush()
		}
		off = c.Offset + int64(len(c.Data))
		if text.Len() > 0 {
			if send("out", strconv.FormatInt(off, 10), outputEvent{Offset: c.Offset, Text: text.String()}) != nil {
				return
			}
		}
		sent += int64(len(c.Data))
		if c.Ended {
			_ = send("end", "", off)
			return
		}
		if sent > maxLivePerPage {
			_ = send("cut", "", off)
			return
		}
	}
}

// attachment sets the headers of a download: never rendered, never sniffed.
func attachment(w http.ResponseWriter, name string) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	w.Header().Set("Content-Security-Policy", downloadPolicy)
}

// safeFileName is the last element of p with anything but a conservative
// set of characters replaced, for the Content-Disposition header.
func safeFileName(p string) string {
	name := path.Base(p)
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, name)
	if strings.Trim(name, "._") == "" {
		return "artifact"
	}
	return name
}

// download serves one of a run's records as a download.
func (h *Handler) download(o Object, name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rc, err := h.source(r).OpenObject(r.Context(), r.PathValue("id"), o)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		defer rc.Close()
		attachment(w, r.PathValue("id")+"-"+name)
		_, _ = io.Copy(w, rc)
	}
}

func (h *Handler) artifact(w http.ResponseWriter, r *http.Request) {
	p := r.PathValue("path")
	rc, err := h.source(r).OpenArtifact(r.Context(), r.PathValue("id"), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer rc.Close()
	attachment(w, safeFileName(p))
	_, _ = io.Copy(w, rc)
}

// readObject reads at most limit bytes of one of the run's records;
// truncated says more followed. A missing record is no error (nil, false).
func (h *Handler) readObject(ctx context.Context, id string, o Object, limit int64) (data []byte, truncated bool, err error) {
	rc, err := h.src.OpenObject(ctx, id, o)
	if errors.Is(err, ErrNoObject) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer rc.Close()
	data, err = io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > limit {
		return data[:limit], true, nil
	}
	return data, false, nil
}

// runPage is the data of a run's page.
type runPage struct {
	Title          string
	Run            Run
	Running        bool
	Log            string
	LogTruncated   bool
	Changes        *changeset.Set
	Files          []diffFile
	PatchTruncated bool
	Artifacts      []Artifact
	Trace          []timelineEntry
	TraceOmitted   int
	Gateway        []timelineEntry
	GatewayOmitted int
	Egress         []egressRow
	EgressOmitted  int
	EgressRecord   *audit.EgressRecord
	Attestation    *attestationView
	Problems       []string
	// CSRF is the form token when the run can be cancelled (or, Paused,
	// resumed) from the page.
	CSRF   string
	Paused bool
}

func (h *Handler) run(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	run, err := h.source(r).Run(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	pg := runPage{Title: "Run " + run.RunID, Run: run, Running: run.Status.Live()}
	problem := func(what string, err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			h.log.Warn("read run record", "run", id, "record", what, "err", err)
			pg.Problems = append(pg.Problems, fmt.Sprintf("%s could not be read", what))
		}
	}
	if !pg.Running {
		pg.Log, pg.LogTruncated, err = h.tail(ctx, id)
		problem("the output log", err)
	}
	if raw, _, err := h.readObject(ctx, id, ObjectChanges, maxAuditBytes); err != nil {
		problem("the change list", err)
	} else if raw != nil {
		var set changeset.Set
		if err := json.Unmarshal(raw, &set); err != nil {
			problem("the change list", err)
		} else {
			for i := range set.Changes {
				c := &set.Changes[i]
				c.Path, c.OldPath, c.Omitted = termsafe.String(c.Path), termsafe.String(c.OldPath), termsafe.String(c.Omitted)
			}
			pg.Changes = &set
		}
	}
	patch, trunc, err := h.readObject(ctx, id, ObjectPatch, MaxShownPatchBytes)
	problem("the patch", err)
	pg.Files, pg.PatchTruncated = parsePatch(patch), trunc
	pg.Artifacts, err = h.src.Artifacts(ctx, id)
	problem("the artifact list", err)
	for i := range pg.Artifacts {
		pg.Artifacts[i].ContentType = termsafe.String(pg.Artifacts[i].ContentType)
	}
	pg.Trace, pg.TraceOmitted, err = h.entries(ctx, id, ObjectTrace, parseTrace)
	problem("the trace", err)
	pg.Gateway, pg.GatewayOmitted, err = h.entries(ctx, id, ObjectGateway, parseGateway)
	problem("the model exchanges", err)
	if rc, err := h.src.OpenObject(ctx, id, ObjectEgress); err == nil {
		pg.Egress, pg.EgressOmitted, err = parseEgress(rc)
		rc.Close()
		problem("the egress record", err)
	} else if !errors.Is(err, ErrNoObject) {
		problem("the egress record", err)
	}
	if rec, err := h.auditRecord(ctx, id); err != nil {
		problem("the isolation record", err)
	} else if rec != nil {
		pg.EgressRecord = rec.Egress
		if rec.Egress != nil {
			nameCredentials(pg.Egress, rec.Egress.Policy)
		}
	}
	pg.Attestation = h.attestation(ctx, run)
	pg.Paused = run.Status == model.StatusPaused
	if h.actions != nil && (pg.Running || pg.Paused) {
		pg.CSRF = h.csrfToken(w, r)
	}
	h.render(w, http.StatusOK, "run.html", pg)
}

// tail reads the last MaxShownLogBytes of the run's stored log, escaped.
func (h *Handler) tail(ctx context.Context, id string) (string, bool, error) {
	rc, err := h.src.OpenObject(ctx, id, ObjectLog)
	if errors.Is(err, ErrNoObject) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	defer rc.Close()
	var ring []byte
	buf := make([]byte, 64<<10)
	truncated := false
	for {
		n, err := rc.Read(buf)
		ring = append(ring, buf[:n]...)
		if len(ring) > MaxShownLogBytes {
			ring = append(ring[:0:0], ring[len(ring)-MaxShownLogBytes:]...)
			truncated = true
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", false, err
		}
	}
	return safeText(ring), truncated, nil
}

func (h *Handler) entries(ctx context.Context, id string, o Object, parse func(io.Reader) ([]timelineEntry, int, error)) ([]timelineEntry, int, error) {
	rc, err := h.src.OpenObject(ctx, id, o)
	if errors.Is(err, ErrNoObject) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer rc.Close()
	return parse(rc)
}

// auditRecord reads the run's isolation record; nil when it has none.
func (h *Handler) auditRecord(ctx context.Context, id string) (*audit.Record, error) {
	raw, trunc, err := h.readObject(ctx, id, ObjectAudit, maxAuditBytes)
	if err != nil || raw == nil {
		return nil, err
	}
	if trunc {
		return nil, fmt.Errorf("isolation record of %s is over %d bytes", id, maxAuditBytes)
	}
	rec, err := audit.ParseRecord(raw)
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// findingRow is one rule's outcome on the isolation page: as recorded when
// the run ran, and as today's rules judge the recorded facts.
type findingRow struct {
	audit.Finding
	Recorded audit.Status
}

// isolationPage is the data of a run's isolation page.
type isolationPage struct {
	Title                string
	Run                  Run
	Record               *audit.Record
	Rows                 []findingRow
	Pass, Fail, NA       int
	Views                []comparison
	Contradictions       []string
	ProbeErrors          []string
	Options, Policy, Raw string
}

func (h *Handler) isolation(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	run, err := h.source(r).Run(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	pg := isolationPage{Title: "Isolation of run " + run.RunID, Run: run}
	rec, err := h.auditRecord(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if rec != nil {
		pg.Record = rec
		recorded := map[string]audit.Status{}
		for _, f := range rec.Findings {
			recorded[f.ID] = f.Status
		}
		today := rec.Recheck()
		pg.Pass, pg.Fail, pg.NA = today.Counts()
		for _, f := range today.Findings {
			f.Reason = termsafe.String(f.Reason)
			pg.Rows = append(pg.Rows, findingRow{Finding: f, Recorded: recorded[f.ID]})
		}
		pg.Views = compareViews(rec)
		for _, c := range rec.ProbeContradictions {
			pg.Contradictions = append(pg.Contradictions, termsafe.String(c))
		}
		if rec.Probe != nil {
			for _, e := range rec.Probe.Errors {
				pg.ProbeErrors = append(pg.ProbeErrors, termsafe.String(e))
			}
		}
		opts, _ := json.MarshalIndent(rec.Options, "", "  ")
		pg.Options = termsafe.String(string(opts))
		if rec.Egress != nil {
			pol, _ := json.MarshalIndent(rec.Egress.Policy, "", "  ")
			pg.Policy = termsafe.String(string(pol))
		}
	}
	h.render(w, http.StatusOK, "isolation.html", pg)
}

func (h *Handler) rules(w http.ResponseWriter, r *http.Request) {
	h.render(w, http.StatusOK, "rules.html", map[string]any{"Title": "Isolation rules", "Rules": audit.Rules()})
}

// hostsPage is the data of the hosts page.
type hostsPage struct {
	Title      string
	Hosts      []Host
	Missing    string
	Unreported bool
}

func (h *Handler) hosts(w http.ResponseWriter, r *http.Request) {
	hosts, err := h.source(r).Hosts(r.Context())
	pg := hostsPage{Title: "Hosts", Hosts: hosts}
	switch {
	case errors.Is(err, ErrNoHosts):
		pg.Missing = err.Error()
	case err != nil:
		h.fail(w, r, err)
		return
	}
	for i := range pg.Hosts {
		pg.Hosts[i].ID = termsafe.String(pg.Hosts[i].ID)
		pg.Unreported = pg.Unreported || !pg.Hosts[i].Reported
	}
	h.render(w, http.StatusOK, "hosts.html", pg)
}
