package workerclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/taskrun/taskrun/model"
)

// HeaderFence carries a lease's epoch on every call a leased worker makes
// for that run: PATCH, stream and renew.
const HeaderFence = "X-Taskrun-Fence"

// HeaderLeaseToken carries a lease's secret token (Lease.Token) beside
// HeaderFence on every call for the run. The control plane answers 428
// without it and 403 when it is not the token of the run's current lease
// or the caller is not the worker the lease was handed to.
const HeaderLeaseToken = "X-Taskrun-Lease-Token"

// ErrLeaseLost is wrapped by the error for a call the control plane refused
// because the caller's lease on the run is stale or expired (412): the run now
// belongs to nobody or to another worker, and the caller must stop it at once.
var ErrLeaseLost = errors.New("workerclient: lease lost: the run's lease is stale or expired")

// ErrNotHolder is wrapped by the error for a call the control plane refused
// because the caller does not hold the run's lease (403): its lease token is
// not the current lease's, or its worker credential is not the one the lease
// was handed to.
var ErrNotHolder = errors.New("workerclient: not the holder of the run's lease")

// MaxLeaseWait caps how long one lease call may be held open by the server.
const MaxLeaseWait = 30 * time.Second

// LeaseRequest is the body of POST /v1/leases: a worker asking for one run.
type LeaseRequest struct {
	// WorkerID names the worker process uniquely and stably for its life
	// (host name plus executor instance ID).
	WorkerID string `json:"worker_id"`
	// Capacity is what the worker can place now.
	Capacity Capacity `json:"capacity"`
	// Labels describe the worker; the control plane only hands it runs whose
	// requirements they meet.
	Labels WorkerLabels `json:"labels"`
	// WaitMillis is how long the server may hold the call when no run is
	// ready (long poll), at most MaxLeaseWait. Zero answers at once.
	WaitMillis int64 `json:"wait_ms"`
	// Live, when set, is where the worker serves the live API of the
	// keep-alive runs it holds: the control plane proxies its users'
	// calls there. It is kept in memory only, never listed.
	Live *LiveEndpoint `json:"live,omitempty"`
}

// LiveEndpoint is a worker's live API: its base URL and the secret the
// control plane sends as a bearer token.
type LiveEndpoint struct {
	URL    string `json:"url"`
	Secret string `json:"secret"`
}

// Capacity is what a worker has free and in all.
type Capacity struct {
	// Slots and FreeSlots count concurrent runs: in all and free now.
	Slots     int `json:"slots"`
	FreeSlots int `json:"free_slots"`
	// FreeMemoryBytes and FreeDiskBytes are what the worker can still grant
	// runs (limits of the runs it holds already subtracted). Zero: unknown.
	FreeMemoryBytes int64 `json:"free_memory_bytes,omitempty"`
	FreeDiskBytes   int64 `json:"free_disk_bytes,omitempty"`
}

// WorkerLabels say what a worker can run.
type WorkerLabels struct {
	// Runtimes are the OCI runtimes the worker offers (e.g. "runc", "runsc").
	Runtimes []string `json:"runtimes"`
	// Images are the images the worker has locally (references as given to
	// it); a worker that may pull says so with CanPull.
	Images  []string `json:"images,omitempty"`
	CanPull bool     `json:"can_pull,omitempty"`
	// Backend is the sandbox backend ("docker", "kubernetes").
	Backend string `json:"backend,omitempty"`
}

// Assignment is the answer to a lease call that got a run: the lease and
// everything the worker needs to execute the run.
type Assignment struct {
	Lease Lease `json:"lease"`
	// Task, Run and SessionID identify the run; Run.PreviousRunID names the
	// run whose session state it resumes.
	Task      model.Task    `json:"task"`
	Run       model.TaskRun `json:"run"`
	SessionID string        `json:"session_id"`
	// Workspace, when set, is a tar of the starting workspace in the shared
	// store (key relative to the store's root), to be unpacked with the safe
	// unpacker; its size and SHA-256 are checked before use.
	Workspace *StoredObject `json:"workspace,omitempty"`
	// Model names the model entry ("scripted", "openai:gpt-4.1", ...).
	Model string `json:"model,omitempty"`
	// Image and Runtime select the container; empty means the worker's defaults.
	Image   string `json:"image,omitempty"`
	Runtime string `json:"runtime,omitempty"`
	// Command overrides the image's agent command; Env adds variables (the
	// names taskrun reserves are refused by the worker).
	Command []string `json:"command,omitempty"`
	Env     []string `json:"env,omitempty"`
	// Limits bound the run; zero fields take the worker's defaults, and a
	// worker refuses (does not lease) a run over its own maxima.
	Limits Limits `json:"limits"`
	// Egress is the run's egress policy as the policy file's JSON; absent
	// means no network.
	Egress json.RawMessage `json:"egress,omitempty"`
	// Retryable says the task may be executed again if this attempt's worker
	// is lost; otherwise a lost run is finalized FAILED ("worker lost").
	Retryable bool `json:"retryable,omitempty"`
	// KeepAlive asks for a live run, served by the worker's live API until
	// cancelled, its timeout or IdleTimeoutMillis with no call (zero, or
	// over the worker's bound: the worker's bound); Ports are the ports
	// its agent serves (see controlplane.SubmitRequest).
	KeepAlive         bool  `json:"keep_alive,omitempty"`
	IdleTimeoutMillis int64 `json:"idle_timeout_ms,omitempty"`
	Ports             []int `json:"ports,omitempty"`
	// Resume says the run was PAUSED and its owner asked to resume it: the
	// worker restores it from the checkpoint its record names
	// (executor.Host.Resume) instead of starting it afresh.
	Resume bool `json:"resume,omitempty"`
}

// StoredObject names an object in the shared blob store.
type StoredObject struct {
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Limits bound one run. Zero means the worker's default.
type Limits struct {
	TimeoutMillis  int64   `json:"timeout_ms,omitempty"`
	MemoryBytes    int64   `json:"memory_bytes,omitempty"`
	CPUs           float64 `json:"cpus,omitempty"`
	PIDs           int64   `json:"pids,omitempty"`
	DiskBytes      int64   `json:"disk_bytes,omitempty"`
	MaxOutputBytes int64   `json:"max_output_bytes,omitempty"`
	// MaxTokens caps the tokens the gateway meters for the run (0: no cap).
	MaxTokens int64 `json:"max_tokens,omitempty"`
}

// Lease is a worker's time-bound, fenced claim on one run.
type Lease struct {
	// RunID is the leased run.
	RunID string `json:"run_id"`
	// Epoch grows each time the run is leased. The worker sends it in
	// HeaderFence on every call for the run; the control plane refuses (412)
	// any call whose epoch is not the run's current one.
	Epoch int64 `json:"epoch"`
	// Token is the lease's fencing token: a secret of at least 128 random
	// bits, known only to the worker the lease was handed to (the control
	// plane keeps its hash). The worker sends it in HeaderLeaseToken on
	// every call for the run.
	Token string `json:"token"`
	// ExpiresAt is when the lease lapses unless renewed (unix milliseconds,
	// the control plane's clock). TTLMillis is the lease's length; the worker
	// renews every RenewMillis, measured on its own monotonic clock.
	ExpiresAt   int64 `json:"expires_at"`
	TTLMillis   int64 `json:"ttl_ms"`
	RenewMillis int64 `json:"renew_ms"`
	// WaitedMillis is how long the control plane held the lease call (the
	// long poll) before it handed the lease out: the lease's TTL counts
	// from then, not from when the worker sent the call. The worker counts
	// its own idea of the expiry from the time it sent the call plus this,
	// which is never later than the control plane's.
	WaitedMillis int64 `json:"waited_ms,omitempty"`
}

// RenewResponse is the answer to POST /v1/leases/{run}/renew.
type RenewResponse struct {
	ExpiresAt int64 `json:"expires_at"`
	// Cancel is set when the run was cancelled by its owner: the worker stops
	// it and reports CANCELLED.
	Cancel bool `json:"cancel,omitempty"`
}

// AcquireLease asks the control plane for one run (POST /v1/leases), waiting
// up to req.WaitMillis for one. It returns (nil, nil) when none came. It is
// not retried: the worker's lease loop calls it again after a backoff.
func (c *Client) AcquireLease(ctx context.Context, req LeaseRequest) (*Assignment, error) {
	if c.baseErr != nil {
		return nil, c.baseErr
	}
	req.WaitMillis = min(max(req.WaitMillis, 0), MaxLeaseWait.Milliseconds())
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("workerclient: encode lease request: %w", err)
	}
	actx, cancel := context.WithTimeout(ctx, time.Duration(req.WaitMillis)*time.Millisecond+c.attemptTimeout)
	defer cancel()
	r, err := http.NewRequestWithContext(actx, http.MethodPost, c.base.JoinPath("v1", "leases").String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("workerclient: lease request: %w", err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(r)
	if err != nil {
		return nil, fmt.Errorf("workerclient: lease: %w", &netError{err: err})
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNoContent:
		return nil, nil
	case resp.StatusCode == http.StatusOK:
		var a Assignment
		if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&a); err != nil {
			return nil, fmt.Errorf("workerclient: decode lease answer: %w", err)
		}
		if err := ValidateTaskRunID(a.Lease.RunID); err != nil {
			return nil, fmt.Errorf("workerclient: lease answer: %w", err)
		}
		if a.Run.ID != a.Lease.RunID || a.Lease.Epoch <= 0 {
			return nil, fmt.Errorf("workerclient: lease answer is inconsistent: run %q, lease on %q epoch %d", a.Run.ID, a.Lease.RunID, a.Lease.Epoch)
		}
		if a.Lease.Token == "" {
			return nil, fmt.Errorf("workerclient: lease answer on run %s has no lease token: upgrade the control plane", a.Lease.RunID)
		}
		return &a, nil
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("workerclient: lease: %w", &HTTPError{StatusCode: resp.StatusCode, Body: string(b),
			RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), c.now())})
	}
}

// RenewLease extends the lease on runID (POST /v1/leases/{id}/renew with the
// epoch in HeaderFence), retrying transient failures within the client's
// retry policy. A stale or expired lease is an error wrapping ErrLeaseLost.
func (c *Client) RenewLease(ctx context.Context, l Lease) (RenewResponse, error) {
	var out RenewResponse
	u, err := c.endpointUnder("leases", l.RunID, "/renew")
	if err != nil {
		return out, err
	}
	fenced := c.Fenced(l)
	err = fenced.doJSON(ctx, http.MethodPost, u, nil, &out)
	if err != nil {
		return out, fmt.Errorf("workerclient: renew lease on run %s epoch %d: %w", l.RunID, l.Epoch, err)
	}
	return out, nil
}

// Fenced returns a client that sends l's epoch in HeaderFence and its token
// in HeaderLeaseToken on every call: the client to give RunTask (as its
// updater and stream sender) for a leased run. The returned client shares
// c's transport.
func (c *Client) Fenced(l Lease) *Client {
	f := *c
	f.fence, f.leaseToken = l.Epoch, l.Token
	return &f
}

// endpointUnder returns the URL of /v1/{collection}/{id}{suffix}.
func (c *Client) endpointUnder(collection, id, suffix string) (string, error) {
	if c.baseErr != nil {
		return "", c.baseErr
	}
	if err := ValidateTaskRunID(id); err != nil {
		return "", err
	}
	return c.base.JoinPath("v1", collection, id).String() + suffix, nil
}

// doJSON sends body (nil: empty) as JSON and decodes a 200 answer into out,
// retrying per the client's policy.
func (c *Client) doJSON(ctx context.Context, method, u string, body any, out any) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return fmt.Errorf("encode: %w", err)
		}
	}
	var answer []byte
	c2 := *c
	c2.onBody = func(b []byte) { answer = b }
	err := c2.do(ctx, func(ctx context.Context) (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		if payload != nil {
			r.Header.Set("Content-Type", "application/json")
		}
		return r, nil
	})
	if err != nil {
		return err
	}
	if out != nil && len(answer) > 0 {
		if err := json.Unmarshal(answer, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
	}
	return nil
}

// fenceHeader sets HeaderFence and HeaderLeaseToken when the client is
// fenced.
func (c *Client) fenceHeader(r *http.Request) {
	if c.fence > 0 {
		r.Header.Set(HeaderFence, strconv.FormatInt(c.fence, 10))
	}
	if c.leaseToken != "" {
		r.Header.Set(HeaderLeaseToken, c.leaseToken)
	}
}
