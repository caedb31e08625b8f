package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/executor"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/workspace"
)

// Client talks to the daemon at one socket.
type Client struct {
	path string
	http *http.Client
}

// Dial connects to the daemon at path once, to see that one answers:
// errors.Is(err, ErrNoDaemon) when nothing listens there (no socket, or a
// stale one).
func Dial(ctx context.Context, path string) (*Client, error) {
	if path == "" {
		return nil, ErrNoDaemon
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (%s)", ErrNoDaemon, path)
		}
		return nil, fmt.Errorf("taskrun daemon at %s: %w", path, err)
	}
	c.Close()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		DisableCompression: true,
	}
	return &Client{path: path, http: &http.Client{Transport: tr}}, nil
}

// DialFirst dials the paths in order (see ClientSocketPaths) and returns
// the first daemon that answers; errors.Is(err, ErrNoDaemon) when none
// does. Any other failure (a socket it may not connect to) is returned.
func DialFirst(ctx context.Context, paths []string) (*Client, error) {
	for _, p := range paths {
		c, err := Dial(ctx, p)
		if errors.Is(err, ErrNoDaemon) {
			continue
		}
		return c, err
	}
	return nil, fmt.Errorf("%w (tried %v)", ErrNoDaemon, paths)
}

// Path is the daemon's socket.
func (c *Client) Path() string { return c.path }

// Close releases the client's connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Run asks the daemon to run req, with the workspace dir (packed here, as
// the caller, when not empty), copies the run's output to stdout and stderr
// as it comes and returns its result. When ctx ends, Run asks the daemon to
// cancel the run and goes on reading until the result: a caller that
// wants to leave at once (detach) just exits, and the daemon finishes the
// run. A daemon that goes away before the result is ErrDaemonGone.
func (c *Client) Run(ctx context.Context, req RunRequest, dir string, stdout, stderr io.Writer) (*Result, error) {
	req.Workspace = dir != ""
	if req.Workspace {
		// Open it here, as the caller: a directory the caller cannot read
		// is refused before anything is sent.
		f, err := os.Open(dir)
		if err == nil {
			_, err = f.Readdirnames(1)
			f.Close()
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("--workspace: %w", err)
		}
	}
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	body := io.Reader(bytes.NewReader(append(line, '\n')))
	if req.Workspace {
		pr, pw := io.Pipe()
		go func() {
			_, err := workspace.PackHome(ctx, dir, pw, workspace.PackOptions{})
			pw.CloseWithError(err)
		}()
		defer pr.Close()
		body = io.MultiReader(body, pr)
	}
	// The request outlives ctx: the result of a cancelled run still comes.
	hreq, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, "http://taskrun"+PathRuns, body)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: run %s: %w", ErrDaemonGone, req.RunID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, refused(resp)
	}
	stop := context.AfterFunc(ctx, func() { c.cancel(req.RunID) })
	defer stop()
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	for {
		var fr Frame
		if err := dec.Decode(&fr); err != nil {
			return nil, fmt.Errorf("%w: run %s has no result (%w): a restarted daemon recovers it; see taskrun runs", ErrDaemonGone, req.RunID, err)
		}
		switch {
		case fr.Result != nil:
			return fr.Result, nil
		case fr.Started != "":
			return &Result{}, nil
		case fr.Stdout != nil:
			_, _ = stdout.Write(fr.Stdout)
		case fr.Stderr != nil:
			_, _ = stderr.Write(fr.Stderr)
		}
	}
}

// cancel asks the daemon to cancel the run, on a connection of its own.
func (c *Client) cancel(runID string) {
	ctx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://taskrun/v1/runs/"+url.PathEscape(runID)+"/cancel", nil)
	if err != nil {
		return
	}
	if resp, err := c.http.Do(req); err == nil {
		resp.Body.Close()
	}
}

// send sends one request to the daemon, path under its API: a daemon
// that does not answer is ErrDaemonGone, and an answer other than want
// (0: any 2xx) a RefusedError. The caller closes the response's body.
func (c *Client) send(ctx context.Context, method, path string, body io.Reader, want int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://taskrun"+path, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDaemonGone, err)
	}
	if (want == 0 && resp.StatusCode/100 != 2) || (want != 0 && resp.StatusCode != want) {
		defer resp.Body.Close()
		return nil, refused(resp)
	}
	return resp, nil
}

// runPath is the path of run runID's endpoint tail.
func runPath(runID, tail string) string { return "/v1/runs/" + url.PathEscape(runID) + tail }

// refused reads a refused response's error.
func refused(resp *http.Response) error {
	var eb ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
		eb.Error = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	return &RefusedError{Status: resp.StatusCode, Message: eb.Error}
}

// Start asks the daemon for req as a keep-alive run (with the workspace
// dir when not empty) and returns once it runs; it lives on in the
// daemon until Stop, its idle timeout or its run timeout.
func (c *Client) Start(ctx context.Context, req RunRequest, dir string) error {
	req.KeepAlive = true
	res, err := c.Run(ctx, req, dir, io.Discard, io.Discard)
	if err != nil {
		return err
	}
	if res.Error != "" {
		return errors.New(res.Error)
	}
	return nil
}

// Stop stops the caller's live run runID: its record says it was cancelled.
func (c *Client) Stop(ctx context.Context, runID string) error {
	resp, err := c.send(ctx, http.MethodPost, runPath(runID, "/cancel"), nil, http.StatusNoContent)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Pause pauses the caller's live run runID (executor.Host.Pause) and
// returns its outcome: PAUSED, its Checkpoint the manifest a resume needs.
func (c *Client) Pause(ctx context.Context, runID string) (*executor.Outcome, error) {
	resp, err := c.send(ctx, http.MethodPost, runPath(runID, "/pause"), nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out executor.Outcome
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxOutcome)).Decode(&out); err != nil {
		return nil, fmt.Errorf("daemon: pause %s: %w", runID, err)
	}
	return &out, nil
}

// Resume resumes the caller's run runID paused through the daemon as a
// live run again. It returns once the agent runs (a Result with no
// Outcome) or with how the run ended first; a checkpoint the host refused
// is an error wrapping ErrRefused, and the run stays paused.
func (c *Client) Resume(ctx context.Context, runID string) (*Result, error) {
	resp, err := c.send(ctx, http.MethodPost, runPath(runID, "/resume"), nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fr Frame
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxOutcome)).Decode(&fr); err != nil {
		return nil, fmt.Errorf("%w: resume %s: %w", ErrDaemonGone, runID, err)
	}
	if r := fr.Result; r != nil && r.Outcome == nil && r.Error != "" {
		// Refused before it ran (a changed or foreign checkpoint, a
		// looser policy): the run stays paused.
		return nil, fmt.Errorf("daemon: resume %s: %w", runID, &RefusedError{Status: http.StatusConflict, Message: r.Error})
	}
	if fr.Result != nil {
		return fr.Result, nil
	}
	return &Result{}, nil
}

// Fork starts req.N forks of the caller's live or paused run runID, each
// a live run of its own whose records name runID as its parent, and
// returns them once each runs or ended first.
func (c *Client) Fork(ctx context.Context, runID string, req ForkRequest) (*ForkResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://taskrun/v1/runs/"+url.PathEscape(runID)+"/fork", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDaemonGone, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, refused(resp)
	}
	var res ForkResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxOutcome)).Decode(&res); err != nil {
		return nil, fmt.Errorf("%w: fork %s: %w", ErrDaemonGone, runID, err)
	}
	return &res, nil
}

// maxOutcome caps an Outcome the daemon answers.
const maxOutcome = 16 << 20

// Exec runs req in the caller's live run runID, copies its output to
// stdout and stderr as it comes and returns how it ended.
func (c *Client) Exec(ctx context.Context, runID string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, http.MethodPost, runPath(runID, "/exec"), bytes.NewReader(body), http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	for {
		var fr Frame
		if err := dec.Decode(&fr); err != nil {
			return nil, fmt.Errorf("%w: command in run %s has no result: %w", ErrDaemonGone, runID, err)
		}
		switch {
		case fr.Exec != nil:
			return fr.Exec, nil
		case fr.Stdout != nil:
			_, _ = stdout.Write(fr.Stdout)
		case fr.Stderr != nil:
			_, _ = stderr.Write(fr.Stderr)
		}
	}
}

// files calls the file API of the caller's live run runID.
func (c *Client) files(ctx context.Context, method, runID, path, op string, body io.Reader) (*http.Response, error) {
	q := url.Values{"path": {path}}
	if op != "" {
		q.Set("op", op)
	}
	return c.send(ctx, method, runPath(runID, "/files?"+q.Encode()), body, 0)
}

// ReadFile reads path, under the home of the caller's live run runID.
func (c *Client) ReadFile(ctx context.Context, runID, path string) ([]byte, error) {
	resp, err := c.files(ctx, http.MethodGet, runID, path, "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, MaxFileBytes))
}

// WriteFile writes data to path (created or truncated, owned by the
// run's user), under the home of the caller's live run runID.
func (c *Client) WriteFile(ctx context.Context, runID, path string, data []byte) error {
	resp, err := c.files(ctx, http.MethodPut, runID, path, "", bytes.NewReader(data))
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Stat describes path (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, runID, path string) (*FileInfo, error) {
	resp, err := c.files(ctx, http.MethodGet, runID, path, "stat", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	return &fi, json.NewDecoder(resp.Body).Decode(&fi)
}

// List lists the directory path.
func (c *Client) List(ctx context.Context, runID, path string) ([]FileInfo, error) {
	resp, err := c.files(ctx, http.MethodGet, runID, path, "list", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list []FileInfo
	return list, json.NewDecoder(resp.Body).Decode(&list)
}

// Remove removes path (an empty directory, a file or a symlink).
func (c *Client) Remove(ctx context.Context, runID, path string) error {
	resp, err := c.files(ctx, http.MethodDelete, runID, path, "", nil)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Watch watches path (a directory's entries, or a file) under the home
// of the caller's live run runID, calling fn with each event, "watching"
// first, until the watch ends (nil), ctx is done or fn fails.
func (c *Client) Watch(ctx context.Context, runID, path string, fn func(WatchEvent) error) error {
	resp, err := c.files(ctx, http.MethodGet, runID, path, "watch", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var e WatchEvent
		if err := dec.Decode(&e); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("run %s: the watch of %s: %w", runID, path, err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// call sends one request of the process API and decodes a JSON answer
// into out (nil: none); a refusal is a RefusedError.
func (c *Client) call(ctx context.Context, method, p string, body io.Reader, out any) error {
	resp, err := c.send(ctx, method, p, body, 0)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// processPath is the path of process pid of run runID, with tail.
func processPath(runID, pid, tail string) string {
	return runPath(runID, "/processes/"+url.PathEscape(pid)+tail)
}

// StartProcess starts req in the background in the caller's live run
// runID and returns it once it runs: follow it with Output.
func (c *Client) StartProcess(ctx context.Context, runID string, req ExecRequest) (*ProcessInfo, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var info ProcessInfo
	if err := c.call(ctx, http.MethodPost, runPath(runID, "/processes"), bytes.NewReader(body), &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Processes lists the commands of the caller's live run runID, oldest first.
func (c *Client) Processes(ctx context.Context, runID string) ([]ProcessInfo, error) {
	var list []ProcessInfo
	return list, c.call(ctx, http.MethodGet, runPath(runID, "/processes"), nil, &list)
}

// Process describes command pid of the caller's live run runID.
func (c *Client) Process(ctx context.Context, runID, pid string) (*ProcessInfo, error) {
	var info ProcessInfo
	if err := c.call(ctx, http.MethodGet, processPath(runID, pid, ""), nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Output copies command pid's output from offset to stdout and stderr:
// to its end and then its result, or with follow false what is there
// (the result nil while it runs). It returns the offset past what it
// copied too, to go on from.
func (c *Client) Output(ctx context.Context, runID, pid string, offset int64, follow bool, stdout, stderr io.Writer) (*ExecResult, int64, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}, "follow": {strconv.FormatBool(follow)}}
	resp, err := c.send(ctx, http.MethodGet, processPath(runID, pid, "/output?"+q.Encode()), nil, http.StatusOK)
	if err != nil {
		return nil, offset, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	for {
		var fr Frame
		if err := dec.Decode(&fr); errors.Is(err, io.EOF) && !follow {
			return nil, offset, nil
		} else if err != nil {
			return nil, offset, fmt.Errorf("%w: process %s of run %s has no result: %w", ErrDaemonGone, pid, runID, err)
		}
		switch {
		case fr.Exec != nil:
			return fr.Exec, offset, nil
		case fr.Stdout != nil:
			_, _ = stdout.Write(fr.Stdout)
			offset = fr.Offset + int64(len(fr.Stdout))
		case fr.Stderr != nil:
			_, _ = stderr.Write(fr.Stderr)
			offset = fr.Offset + int64(len(fr.Stderr))
		}
	}
}

// WriteStdin writes data (at most MaxStdinBytes) to the stdin of command
// pid, and closes it after when closeAfter.
func (c *Client) WriteStdin(ctx context.Context, runID, pid string, data []byte, closeAfter bool) error {
	return c.call(ctx, http.MethodPost, processPath(runID, pid, "/stdin?close="+strconv.FormatBool(closeAfter)), bytes.NewReader(data), nil)
}

// Signal sends signal sig (a name of Signals) to command pid.
func (c *Client) Signal(ctx context.Context, runID, pid, sig string) error {
	body, err := json.Marshal(SignalRequest{Signal: sig})
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, processPath(runID, pid, "/signal"), bytes.NewReader(body), nil)
}

// Usage is the resource usage of the caller's live run runID at its last
// live sample.
func (c *Client) Usage(ctx context.Context, runID string) (*sandbox.Usage, error) {
	var u sandbox.Usage
	if err := c.call(ctx, http.MethodGet, runPath(runID, "/usage"), nil, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// Ports lists the declared ports of the caller's live run runID, each with
// the path it answers on and its token (PortTokenHeader).
func (c *Client) Ports(ctx context.Context, runID string) ([]PortInfo, error) {
	var list []PortInfo
	return list, c.call(ctx, http.MethodGet, runPath(runID, "/ports"), nil, &list)
}
