package webui

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
)

// Actions carry out what a signed-in user asks of their own runs: submit a
// task, cancel a run and resume a paused one. The interface checks the request (CSRF, and that
// the run is the tenant's) before it calls them; an implementation checks
// authorization again (APIActions goes through the user API).
type Actions interface {
	// Submit submits a task as r's user and returns the new run's id.
	Submit(r *http.Request, req controlplane.SubmitRequest) (runID string, err error)
	// Cancel cancels r's user's run id.
	Cancel(r *http.Request, id string) error
	// Resume resumes r's user's PAUSED run id.
	Resume(r *http.Request, id string) error
	// Fork asks for n forks of r's user's run id, with prompt (empty: the
	// parent's), and returns their IDs.
	Fork(r *http.Request, id string, n int, prompt string) ([]string, error)
}

// ActionError is an action the control plane refused, with its status and
// its message.
type ActionError struct {
	Status  int
	Message string
}

func (e *ActionError) Error() string {
	return fmt.Sprintf("webui: the control plane answered %d: %s", e.Status, e.Message)
}

// APIActions carries out actions through the control plane's user API,
// in-process: each is a request to API (the control plane's handler) with
// the browser request's own Authorization, so the API authenticates it and
// checks the run is the user's exactly as for any client.
type APIActions struct {
	// API is the control plane's handler (server.Server.Handler).
	API http.Handler
}

var _ Actions = (*APIActions)(nil)

// Submit posts the task to /v1/tasks.
func (a *APIActions) Submit(r *http.Request, req controlplane.SubmitRequest) (string, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	var resp controlplane.SubmitResponse
	if err := a.call(r, "/v1/tasks", body, &resp); err != nil {
		return "", err
	}
	return resp.RunID, nil
}

// Cancel posts to /v1/runs/{id}/cancel.
func (a *APIActions) Cancel(r *http.Request, id string) error {
	return a.call(r, "/v1/runs/"+url.PathEscape(id)+"/cancel", nil, nil)
}

// Resume posts to /v1/runs/{id}/resume.
func (a *APIActions) Resume(r *http.Request, id string) error {
	return a.call(r, "/v1/runs/"+url.PathEscape(id)+"/resume", nil, nil)
}

// Fork posts to /v1/runs/{id}/fork.
func (a *APIActions) Fork(r *http.Request, id string, n int, prompt string) ([]string, error) {
	body, err := json.Marshal(controlplane.ForkRequest{N: n, Prompt: prompt})
	if err != nil {
		return nil, err
	}
	var resp controlplane.ForkResponse
	if err := a.call(r, "/v1/runs/"+url.PathEscape(id)+"/fork", body, &resp); err != nil {
		return nil, err
	}
	ids := make([]string, len(resp.Runs))
	for i, run := range resp.Runs {
		ids[i] = run.ID
	}
	return ids, nil
}

// call makes one user API request as r's user and decodes its answer.
func (a *APIActions) call(r *http.Request, path string, body []byte, out any) error {
	if a.API == nil {
		return errors.New("webui: APIActions has no API handler")
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set("Content-Type", "application/json")
	rec := &recorder{header: http.Header{}}
	a.API.ServeHTTP(rec, req)
	if rec.status/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(rec.body.Bytes(), &e)
		if e.Error == "" {
			e.Error = http.StatusText(rec.status)
		}
		return &ActionError{Status: rec.status, Message: e.Error}
	}
	if out != nil {
		return json.Unmarshal(rec.body.Bytes(), out)
	}
	return nil
}

// recorder holds one in-process answer.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.body.Len() > 1<<20 {
		return len(p), nil
	}
	return r.body.Write(p)
}

// CSRF protection of the interface's forms: a double-submit token. Each
// browser gets a random token in a cookie (HttpOnly, SameSite=Strict, path
// of the interface); each form carries it in a hidden field. A POST is
// carried out only when its field matches its cookie, and its Origin is the
// interface's own (or, without Origin, Sec-Fetch-Site says same-origin). A
// page of another origin can neither read the cookie nor send an Origin of
// ours; SameSite keeps the cookie off requests from other sites.
const (
	// CSRFCookie is the cookie holding the browser's token.
	CSRFCookie = "taskrun_csrf"
	// CSRFField is the form field carrying it.
	CSRFField = "csrf"
	// maxFormBytes bounds a form's body.
	maxFormBytes = 1 << 20
)

// Errors of a refused form.
var (
	// ErrCrossOrigin: the form came from another origin.
	ErrCrossOrigin = errors.New("webui: the form was sent from another origin")
	// ErrCSRFToken: the form's token is missing or does not match.
	ErrCSRFToken = errors.New("webui: the form's token is missing or stale; reload the page and try again")
)

// csrfToken returns r's browser token, setting a new one when it has none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(CSRFCookie); err == nil && validToken(c.Value) {
		return c.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: CSRFCookie, Value: tok, Path: h.base + "/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return tok
}

func validToken(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// checkForm refuses a POST from another origin or without the browser's
// token, and parses the form.
func (h *Handler) checkForm(w http.ResponseWriter, r *http.Request) error {
	if err := sameOrigin(r); err != nil {
		return err
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("webui: read the form: %w", err)
	}
	c, err := r.Cookie(CSRFCookie)
	if err != nil || !validToken(c.Value) {
		return ErrCSRFToken
	}
	if subtle.ConstantTimeCompare([]byte(c.Value), []byte(r.PostForm.Get(CSRFField))) != 1 {
		return ErrCSRFToken
	}
	return nil
}

// sameOrigin accepts a request whose Origin names the host it was sent to,
// or, without Origin, whose Sec-Fetch-Site is same-origin. A request with
// neither is refused: every browser sends one of them with a POST.
func sameOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || o == "null" || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Errorf("%w: Origin %q, this interface is at %q", ErrCrossOrigin, o, r.Host)
		}
		return nil
	}
	if r.Header.Get("Sec-Fetch-Site") == "same-origin" {
		return nil
	}
	return fmt.Errorf("%w: no Origin and Sec-Fetch-Site %q", ErrCrossOrigin, r.Header.Get("Sec-Fetch-Site"))
}

// refuse answers a form the interface will not carry out.
func (h *Handler) refuse(w http.ResponseWriter, err error) {
	msg := "this form cannot be accepted"
	if errors.Is(err, ErrCSRFToken) {
		msg = ErrCSRFToken.Error()
	} else if errors.Is(err, ErrCrossOrigin) {
		msg = "the form was sent from another site"
	}
	h.log.Warn("form refused", "err", err)
	h.render(w, http.StatusForbidden, "error.html", map[string]any{"Title": http.StatusText(http.StatusForbidden), "Message": msg})
}

// submitPage is the data of the submit form.
type submitPage struct {
	Title string
	CSRF  string
	// Form holds what was typed, shown again with Error when refused.
	Prompt, Image, Model, Runtime, Command string
	Error                                  string
}

func (h *Handler) submitForm(w http.ResponseWriter, r *http.Request) {
	h.render(w, http.StatusOK, "submit.html", submitPage{Title: "Submit a task", CSRF: h.csrfToken(w, r)})
}

func (h *Handler) submit(w http.ResponseWriter, r *http.Request) {
	if err := h.checkForm(w, r); err != nil {
		h.refuse(w, err)
		return
	}
	f := r.PostForm
	pg := submitPage{Title: "Submit a task", CSRF: h.csrfToken(w, r), Prompt: f.Get("prompt"), Image: strings.TrimSpace(f.Get("image")),
		Model: strings.TrimSpace(f.Get("model")), Runtime: strings.TrimSpace(f.Get("runtime")), Command: f.Get("command")}
	req := controlplane.SubmitRequest{Prompt: pg.Prompt, Image: pg.Image, Model: pg.Model, Runtime: pg.Runtime}
	for _, line := range strings.Split(pg.Command, "\n") {
		if line = strings.TrimRight(line, "\r"); line != "" {
			req.Command = append(req.Command, line)
		}
	}
	id, err := h.actions.Submit(r, req)
	if err != nil {
		status := http.StatusBadGateway
		pg.Error = "the control plane could not be reached; see the server's log"
		if ae := (*ActionError)(nil); errors.As(err, &ae) {
			status, pg.Error = ae.Status, ae.Message
		} else {
			h.log.Error("submit", "err", err)
		}
		h.render(w, status, "submit.html", pg)
		return
	}
	http.Redirect(w, r, h.base+"/runs/"+url.PathEscape(id), http.StatusSeeOther)
}

func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	h.runAction(w, r, h.actions.Cancel)
}

func (h *Handler) resume(w http.ResponseWriter, r *http.Request) {
	h.runAction(w, r, h.actions.Resume)
}

// fork asks for the form's forks of the run and shows the first fork.
func (h *Handler) fork(w http.ResponseWriter, r *http.Request) {
	var first string
	h.runAction(w, r, func(r *http.Request, id string) error {
		n, err := strconv.Atoi(strings.TrimSpace(r.PostForm.Get("n")))
		if err != nil || n < 1 || n > controlplane.MaxForks {
			return &ActionError{Status: http.StatusBadRequest, Message: fmt.Sprintf("forks: give a number from 1 to %d", controlplane.MaxForks)}
		}
		ids, err := h.actions.Fork(r, id, n, r.PostForm.Get("prompt"))
		if err == nil && len(ids) > 0 {
			first = ids[0]
		}
		return err
	}, func(id string) string {
		if first != "" {
			return first
		}
		return id
	})
}

// runAction carries out act on the run of the form's path, once the form
// is checked and the run found the tenant's, and shows the run again.
// next, when not nil, names the run to show after it.
func (h *Handler) runAction(w http.ResponseWriter, r *http.Request, act func(*http.Request, string) error, next ...func(string) string) {
	if err := h.checkForm(w, r); err != nil {
		h.refuse(w, err)
		return
	}
	id := r.PathValue("id")
	if err := model.ValidateID("run", id); err != nil {
		h.fail(w, r, err)
		return
	}
	// Another tenant's run is not found, as on every page.
	if _, err := h.source(r).Run(r.Context(), id); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := act(r, id); err != nil {
		if ae := (*ActionError)(nil); errors.As(err, &ae) {
			h.render(w, ae.Status, "error.html", map[string]any{"Title": http.StatusText(ae.Status), "Message": ae.Message})
			return
		}
		h.fail(w, r, err)
		return
	}
	show := id
	for _, f := range next {
		show = f(id)
	}
	http.Redirect(w, r, h.base+"/runs/"+url.PathEscape(show), http.StatusSeeOther)
}
