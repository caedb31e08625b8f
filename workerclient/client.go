package workerclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/taskrun/taskrun/internal/backoff"
	"github.com/taskrun/taskrun/model"
)

// ErrRejected is wrapped by every error for a request the server refused for
// good (a 4xx other than 429): retrying it cannot succeed.
var ErrRejected = errors.New("workerclient: request rejected by the control plane")

// ErrInvalidTaskRunID is wrapped by the error for a task run ID that is not
// [A-Za-z0-9_-]{1,128}.
var ErrInvalidTaskRunID = errors.New("workerclient: invalid task run ID")

// HTTPError is a non-2xx response from the control plane.
type HTTPError struct {
	// StatusCode is the response's HTTP status code.
	StatusCode int
	// Body is the start of the response body (at most 4 KiB), for diagnosis.
	Body string
	// RetryAfter is the wait the server asked for with Retry-After, or zero.
	RetryAfter time.Duration
}

// Error implements error.
func (e *HTTPError) Error() string {
	body := strings.TrimSpace(e.Body)
	if body == "" {
		return fmt.Sprintf("control plane answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	return fmt.Sprintf("control plane answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), body)
}

// Unwrap returns ErrRejected for permanent rejections so callers can use
// errors.Is(err, ErrRejected), and also ErrLeaseLost for a stale or expired
// lease (412 Precondition Failed) and ErrNotHolder for a lease the caller
// does not hold (403 Forbidden).
func (e *HTTPError) Unwrap() []error {
	if e.Retryable() {
		return nil
	}
	switch e.StatusCode {
	case http.StatusPreconditionFailed:
		return []error{ErrRejected, ErrLeaseLost}
	case http.StatusForbidden:
		return []error{ErrRejected, ErrNotHolder}
	}
	return []error{ErrRejected}
}

// Retryable reports whether the same request may succeed later: 5xx and 429.
func (e *HTTPError) Retryable() bool {
	return e.StatusCode >= 500 || e.StatusCode == http.StatusTooManyRequests
}

// RetryPolicy bounds how a request is retried. A retry waits a jittered
// exponential backoff (InitialBackoff doubling up to MaxBackoff, each wait drawn
// from [d/2, d]) or, when the server sent Retry-After, exactly that long.
type RetryPolicy struct {
	// MaxAttempts caps the number of attempts, the first included (>= 1).
	MaxAttempts int
	// MaxElapsed caps the time from the first attempt to the start of the last;
	// a retry whose wait would pass it is not made.
	MaxElapsed time.Duration
	// InitialBackoff is the wait before the first retry.
	InitialBackoff time.Duration
	// MaxBackoff caps the exponential backoff (not a server's Retry-After).
	MaxBackoff time.Duration
}

// DefaultRetryPolicy rides out a control-plane restart or a stall of tens of
// seconds without giving up.
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts:    12,
	MaxElapsed:     2 * time.Minute,
	InitialBackoff: 100 * time.Millisecond,
	MaxBackoff:     5 * time.Second,
}

// Client talks to the control plane's HTTP API. It is safe for concurrent use.
// It satisfies taskrun.TaskRunUpdater.
type Client struct {
	base           *url.URL
	baseErr        error
	token          string
	hc             *http.Client
	attemptTimeout time.Duration
	retry          RetryPolicy
	sleep          func(ctx context.Context, d time.Duration) error
	now            func() time.Time
	log            *slog.Logger
	// fence is the lease epoch sent in HeaderFence (0: none; see Fenced),
	// leaseToken the lease token sent in HeaderLeaseToken.
	fence      int64
	leaseToken string
	// onBody, when set, receives the body of a 2xx answer (see doJSON).
	onBody func([]byte)
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (transport, proxies, TLS). Its Timeout
// should be zero: the per-attempt timeout is WithAttemptTimeout.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithAttemptTimeout bounds each single HTTP attempt (default 10s).
func WithAttemptTimeout(d time.Duration) Option { return func(c *Client) { c.attemptTimeout = d } }

// WithRetryPolicy replaces DefaultRetryPolicy.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.retry = p } }

// WithSleep replaces the wait between attempts; it must return ctx.Err() when
// ctx ends first. Tests use it to observe backoff without waiting.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Client) { c.sleep = sleep }
}

// WithClock replaces time.Now for elapsed-time bounds and Retry-After dates.
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// WithLogger sets the logger for retries (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.log = l } }

// New returns a Client for the control plane at baseURL (e.g.
// "https://cp.example.com"), authenticating with the bearer token. An invalid
// baseURL is reported by every call.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{
		token:          token,
		hc:             &http.Client{},
		attemptTimeout: 10 * time.Second,
		retry:          DefaultRetryPolicy,
		sleep:          sleepCtx,
		now:            time.Now,
		log:            slog.Default(),
	}
	c.base, c.baseErr = parseBaseURL(baseURL)
	for _, o := range opts {
		o(c)
	}
	return c
}

func parseBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("workerclient: control plane URL %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("workerclient: control plane URL %q must be absolute http:// or https://, e.g. https://cp.example.com", raw)
	}
	return u, nil
}

// ValidateTaskRunID returns an error wrapping ErrInvalidTaskRunID (and
// model.ErrInvalidID) unless id is a valid ID (model.ValidateID).
func ValidateTaskRunID(id string) error {
	if err := model.ValidateID("task run", id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTaskRunID, err)
	}
	return nil
}

// endpoint returns the URL of /v1/task-runs/{id}{suffix}.
func (c *Client) endpoint(taskRunID, suffix string) (string, error) {
	if c.baseErr != nil {
		return "", c.baseErr
	}
	if err := ValidateTaskRunID(taskRunID); err != nil {
		return "", err
	}
	return c.base.JoinPath("v1", "task-runs", url.PathEscape(taskRunID)).String() + suffix, nil
}

// UpdateRunStatus sends PATCH /v1/task-runs/{taskRunID} with req as JSON,
// retrying per the client's RetryPolicy. The PATCH is idempotent, so a retry
// after a lost response is harmless.
func (c *Client) UpdateRunStatus(ctx context.Context, taskRunID string, req *PatchTaskRunRequest) error {
	if req == nil {
		return errors.New("workerclient: UpdateRunStatus needs a non-nil request")
	}
	u, err := c.endpoint(taskRunID, "")
	if err != nil {
		return err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("workerclient: encode PATCH for run %s: %w", taskRunID, err)
	}
	newReq := func(ctx context.Context) (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r.Header.Set("Content-Type", "application/json")
		return r, nil
	}
	if err := c.do(ctx, newReq); err != nil {
		return fmt.Errorf("workerclient: PATCH run %s status %s: %w", taskRunID, req.Status, err)
	}
	return nil
}

// do performs the request built by newReq until it succeeds, fails for good
// or the retry policy or ctx ends.
func (c *Client) do(ctx context.Context, newReq func(context.Context) (*http.Request, error)) error {
	start := c.now()
	for attempt := 1; ; attempt++ {
		err := c.attempt(ctx, newReq)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		}
		wait, ok := c.retryWait(err, attempt)
		if !ok {
			return err
		}
		if attempt >= c.retry.MaxAttempts || c.now().Sub(start)+wait > c.retry.MaxElapsed {
			return fmt.Errorf("giving up after %d attempts in %s: %w", attempt, c.now().Sub(start).Round(time.Millisecond), err)
		}
		c.log.LogAttrs(ctx, slog.LevelWarn, "control plane request failed; retrying",
			slog.Int("attempt", attempt), slog.Duration("wait", wait), slog.Any("error", err))
		if serr := c.sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%w (while waiting to retry after: %w)", serr, err)
		}
	}
}

// attempt performs one HTTP exchange bounded by the attempt timeout.
func (c *Client) attempt(ctx context.Context, newReq func(context.Context) (*http.Request, error)) error {
	actx, cancel := context.WithTimeout(ctx, c.attemptTimeout)
	defer cancel()
	req, err := newReq(actx)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	c.fenceHeader(req)
	resp, err := c.hc.Do(req)
	if err != nil {
		return &netError{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if c.onBody != nil {
			b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if err != nil {
				return &netError{err: err}
			}
			c.onBody(b)
		}
		// Drain so the connection is reused; the bodies of 2xx answers are small.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return &HTTPError{
		StatusCode: resp.StatusCode,
		Body:       string(body),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), c.now()),
	}
}

// retryWait decides whether err is worth retrying and how long to wait first.
func (c *Client) retryWait(err error, attempt int) (time.Duration, bool) {
	var he *HTTPError
	if errors.As(err, &he) {
		if !he.Retryable() {
			return 0, false
		}
		if he.RetryAfter > 0 {
			return he.RetryAfter, true
		}
	} else if !errors.As(err, new(*netError)) {
		return 0, false
	}
	b := backoff.Exponential{Initial: c.retry.InitialBackoff, Max: c.retry.MaxBackoff, Jitter: true}
	return b.Delay(attempt), true
}

// netError marks a failure to get any response: connection refused or reset,
// timeout, TLS failure. These are retried.
type netError struct{ err error }

func (e *netError) Error() string { return "no response: " + e.err.Error() }
func (e *netError) Unwrap() error { return e.err }

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP date; it
// returns zero when absent, malformed or in the past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
