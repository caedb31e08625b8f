package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/taskrun/taskrun/runindex"
)

// get calls a stored-run path with query q; a refusal is a *RefusedError.
func (c *Client) get(ctx context.Context, path string, q url.Values) (*http.Response, error) {
	u := "http://taskrun" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDaemonGone, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, refused(resp)
	}
	return resp, nil
}

// recordPath is a stored-run path of runID.
func recordPath(runID, tail string) string {
	return PathRecords + "/" + url.PathEscape(runID) + tail
}

// userQuery is the query naming user, when not empty.
func userQuery(user string) url.Values {
	q := url.Values{}
	if user != "" {
		q.Set("user", user)
	}
	return q
}

// Records lists the stored runs the caller may read (its tenant's; root:
// user's, or everyone's when empty), newest first, as runindex.List.
func (c *Client) Records(ctx context.Context, f runindex.Filter) ([]runindex.Record, error) {
	q := userQuery(f.UserID)
	if f.TaskID != "" {
		q.Set("task", f.TaskID)
	}
	if f.Status != "" {
		q.Set("status", string(f.Status))
	}
	q.Set("limit", strconv.Itoa(f.Limit))
	resp, err := c.get(ctx, PathRecords, q)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var recs []runindex.Record
	if err := json.NewDecoder(resp.Body).Decode(&recs); err != nil {
		return nil, fmt.Errorf("%w: records: %w", ErrDaemonGone, err)
	}
	return recs, nil
}

// Record is the stored record of runID (with its execs), as
// runindex.Find with user; another tenant's run is not found.
func (c *Client) Record(ctx context.Context, runID, user string) (*runindex.Record, error) {
	resp, err := c.get(ctx, recordPath(runID, ""), userQuery(user))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var rec runindex.Record
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		return nil, fmt.Errorf("%w: record of run %s: %w", ErrDaemonGone, runID, err)
	}
	return &rec, nil
}

// OpenLog opens runID's output log (stderr: its stderr log); with follow,
// a run in progress on the daemon's root is followed to its end.
func (c *Client) OpenLog(ctx context.Context, runID, user string, stderr, follow bool) (io.ReadCloser, error) {
	q := userQuery(user)
	if stderr {
		q.Set("stderr", "1")
	}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.get(ctx, recordPath(runID, "/log"), q)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// OpenObject opens one stored object of runID: what is "patch",
// "changes", or "file" with path (as taskrun cp's PATH).
func (c *Client) OpenObject(ctx context.Context, runID, user, what, path string) (io.ReadCloser, error) {
	q := userQuery(user)
	q.Set("what", what)
	if path != "" {
		q.Set("path", path)
	}
	resp, err := c.get(ctx, recordPath(runID, "/object"), q)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
