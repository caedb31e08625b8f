// Package client is the Go client of the control plane's user API
// (docs/control-plane-api.md, "User API"): submit tasks, list and read runs,
// read or follow a run's output, read its attestation and what it stored
// (record, change set, files), cancel a run. The worker side is
// workerclient.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
)

// ErrNotFound is wrapped by the error for a run the server does not know (or
// that belongs to another user).
var ErrNotFound = errors.New("client: no such run")

// HTTPError is an answer other than the one expected.
type HTTPError struct {
	StatusCode int
	// Message is the server's error message.
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("control plane answered %d: %s", e.StatusCode, e.Message)
}

// Unwrap lets errors.Is(err, ErrNotFound) match a 404.
func (e *HTTPError) Unwrap() error {
	if e.StatusCode == http.StatusNotFound {
		return ErrNotFound
	}
	return nil
}

// maxEnvelopeBytes bounds an attestation read, as attest.MaxEnvelopeBytes
// (not imported: it would bring the blob store's drivers into the client).
const maxEnvelopeBytes = 4 << 20

// Client talks to one control plane with one user token.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// New returns a client of the control plane at baseURL (http or https).
// hc nil: a client without overall timeout (output follows last long);
// every call is bounded by its context.
func New(baseURL, token string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: server URL %q: give http://HOST:PORT or https://HOST", baseURL)
	}
	if token == "" {
		return nil, errors.New("client: no token: give --token or $TASKRUN_TOKEN")
	}
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: u, token: token, hc: hc}, nil
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	return c.doURL(ctx, method, c.base.JoinPath(path), path, q, body, contentType)
}

func (c *Client) doURL(ctx context.Context, method string, u *url.URL, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	if q != nil {
		u.RawQuery = q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	var e struct {
		Error string `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = string(b)
	}
	return &HTTPError{StatusCode: resp.StatusCode, Message: e.Error}
}

func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string, want int, out any) error {
	resp, err := c.do(ctx, method, path, q, body, contentType)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return decodeError(resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("client: decode answer to %s %s: %w", method, path, err)
	}
	return nil
}

// Submit creates a task and its first run. workspace, when not nil, is a
// gzip'd tar of the starting workspace (workspace.PackHome writes one),
// streamed to the server.
func (c *Client) Submit(ctx context.Context, req controlplane.SubmitRequest, workspace io.Reader) (controlplane.SubmitResponse, error) {
	var out controlplane.SubmitResponse
	task, err := json.Marshal(req)
	if err != nil {
		return out, fmt.Errorf("client: encode task: %w", err)
	}
	if workspace == nil {
		return out, c.doJSON(ctx, http.MethodPost, "/v1/tasks", nil, bytes.NewReader(task), "application/json", http.StatusCreated, &out)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := func() error {
			tw, err := mw.CreateFormField("task")
			if err != nil {
				return err
			}
			if _, err := tw.Write(task); err != nil {
				return err
			}
			ww, err := mw.CreateFormFile("workspace", "workspace.tar.gz")
			if err != nil {
				return err
			}
			if _, err := io.Copy(ww, workspace); err != nil {
				return err
			}
			return mw.Close()
		}()
		pw.CloseWithError(err)
	}()
	err = c.doJSON(ctx, http.MethodPost, "/v1/tasks", nil, pr, mw.FormDataContentType(), http.StatusCreated, &out)
	pr.CloseWithError(io.ErrClosedPipe) // unblocks the writer if the server answered early
	return out, err
}

// GetRun returns one run.
func (c *Client) GetRun(ctx context.Context, id string) (controlplane.Run, error) {
	var out controlplane.Run
	if err := model.ValidateID("run", id); err != nil {
		return out, err
	}
	return out, c.doJSON(ctx, http.MethodGet, "/v1/runs/"+id, nil, nil, "", http.StatusOK, &out)
}

// ListRuns lists the user's runs, newest first: status "" for all, limit 0
// for the server's default.
func (c *Client) ListRuns(ctx context.Context, status model.RunStatus, limit int) ([]controlplane.Run, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", string(status))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out controlplane.RunList
	return out.Runs, c.doJSON(ctx, http.MethodGet, "/v1/runs", q, nil, "", http.StatusOK, &out)
}

// Workers lists the workers the control plane heard from lately, most
// recently seen first, with their capacity and labels at their last lease
// request.
func (c *Client) Workers(ctx context.Context) ([]controlplane.Worker, error) {
	var out controlplane.WorkerList
	return out.Workers, c.doJSON(ctx, http.MethodGet, "/v1/workers", nil, nil, "", http.StatusOK, &out)
}

// Cancel cancels a run and returns it.
func (c *Client) Cancel(ctx context.Context, id string) (controlplane.Run, error) {
	var out controlplane.Run
	if err := model.ValidateID("run", id); err != nil {
		return out, err
	}
	return out, c.doJSON(ctx, http.MethodPost, "/v1/runs/"+id+"/cancel", nil, nil, "", http.StatusOK, &out)
}

// Resume asks for the PAUSED run id to be resumed: it goes back to the
// queue and a worker restores it from its checkpoint. A run that is not
// (or no longer) PAUSED is refused (409).
func (c *Client) Resume(ctx context.Context, id string) (controlplane.Run, error) {
	var out controlplane.Run
	if err := model.ValidateID("run", id); err != nil {
		return out, err
	}
	return out, c.doJSON(ctx, http.MethodPost, "/v1/runs/"+id+"/resume", nil, nil, "", http.StatusOK, &out)
}

// Fork asks for req.N forks of the PAUSED or ended run id and returns
// them, QUEUED.
func (c *Client) Fork(ctx context.Context, id string, req controlplane.ForkRequest) ([]controlplane.Run, error) {
	if err := model.ValidateID("run", id); err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out controlplane.ForkResponse
	if err := c.doJSON(ctx, http.MethodPost, "/v1/runs/"+id+"/fork", nil, bytes.NewReader(body), "application/json", http.StatusCreated, &out); err != nil {
		return nil, err
	}
	return out.Runs, nil
}

// Output opens the run's output from offset; with follow the body goes on as
// the output arrives and ends when the stream ends. The caller closes it.
func (c *Client) Output(ctx context.Context, id string, offset int64, follow bool) (io.ReadCloser, error) {
	if err := model.ValidateID("run", id); err != nil {
		return nil, err
	}
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/runs/"+id+"/output", q, nil, "")
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp.Body, nil
}

// Attestation returns the run's attestation: the DSSE envelope of its
// signed in-toto statement, as stored (docs/attestation.md). A run without
// one answers an *HTTPError with status 404.
func (c *Client) Attestation(ctx context.Context, id string) ([]byte, error) {
	if err := model.ValidateID("run", id); err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/runs/"+id+"/attestation", nil, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, decodeError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxEnvelopeBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read run %s's attestation: %w", id, err)
	}
	if len(data) > maxEnvelopeBytes {
		return nil, fmt.Errorf("run %s's attestation is over %d bytes", id, maxEnvelopeBytes)
	}
	return data, nil
}

// Wait polls the run every interval until it ends, and returns it.
func (c *Client) Wait(ctx context.Context, id string, interval time.Duration) (controlplane.Run, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := c.GetRun(ctx, id)
		if err != nil || r.Status.Terminal() {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-t.C:
		}
	}
}

// maxRecordBytes bounds a run's index record read, as the store's run index
// bounds it.
const maxRecordBytes = 4 << 20

// Record returns the run's record as its worker stored it in the shared
// store's run index (the JSON `taskrun inspect --json` prints: status,
// reason, image, limits, isolation verdict, change summary, stored
// objects). A run with no stored record yet answers an *HTTPError 404.
func (c *Client) Record(ctx context.Context, id string) (json.RawMessage, error) {
	rc, err := c.open(ctx, id, "record")
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxRecordBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read run %s's record: %w", id, err)
	}
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("run %s's record is over %d bytes", id, maxRecordBytes)
	}
	return data, nil
}

// OpenPatch opens the run's change set as a git patch (changes.patch). The
// caller closes it.
func (c *Client) OpenPatch(ctx context.Context, id string) (io.ReadCloser, error) {
	return c.open(ctx, id, "patch")
}

// OpenChanges opens the run's change list (changes.json). The caller closes
// it.
func (c *Client) OpenChanges(ctx context.Context, id string) (io.ReadCloser, error) {
	return c.open(ctx, id, "changes")
}

// OpenFile opens one file of the run, named relative to the run as `taskrun
// cp` names it: artifacts/PATH, output/result.md, home/PATH or another
// object the run stored (its record lists them). The caller closes it.
func (c *Client) OpenFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	if err := model.ValidateID("run", id); err != nil {
		return nil, err
	}
	elems := strings.Split(path, "/")
	for i, e := range elems {
		if e == "" || e == "." || e == ".." {
			return nil, fmt.Errorf("client: file path %q: give a clean relative path such as artifacts/report.md", path)
		}
		elems[i] = url.PathEscape(e)
	}
	base := c.base.JoinPath("v1", "runs", id, "files")
	u := *base
	u.Path = base.Path + "/" + path
	u.RawPath = base.EscapedPath() + "/" + strings.Join(elems, "/")
	return c.get(ctx, &u, "/v1/runs/"+id+"/files/"+path)
}

// open GETs /v1/runs/{id}/{what}.
func (c *Client) open(ctx context.Context, id, what string) (io.ReadCloser, error) {
	if err := model.ValidateID("run", id); err != nil {
		return nil, err
	}
	p := "/v1/runs/" + id + "/" + what
	return c.get(ctx, c.base.JoinPath(p), p)
}

func (c *Client) get(ctx context.Context, u *url.URL, path string) (io.ReadCloser, error) {
	resp, err := c.doURL(ctx, http.MethodGet, u, path, nil, nil, "")
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp.Body, nil
}
