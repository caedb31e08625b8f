package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/postgres"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox"
)

const serveHelp = `
Serves the reference control plane: the user API (taskrun submit, runs and
logs --server), the worker API (taskrun worker leases runs, reports status
and streams output), the read-only web interface under /ui/ (sign in with
any user name and a user token as the password), /metrics (Prometheus),
/healthz and /readyz.

--db is sqlite:///path/to/file.db (the default; one replica) or a
postgres:// URL (several replicas may share it). The schema is created or
upgraded at start. --store is the blob store shared with the workers:
uploaded workspaces are written there for them to read.

Tokens never go on the command line: worker credentials come from
--worker-token-file (lines "NAME TOKEN", one per worker; a single "TOKEN" line
names worker default) or $TASKRUN_WORKER_TOKEN (worker default), user tokens
from --user-token-file (lines "USER TOKEN", or "TOKEN" for user local) or
$TASKRUN_USER_TOKEN. A worker token is refused on the user API and a user
token on the worker API. A lease is bound to the worker credential it was
handed to: another worker's credential cannot report for it.

--attest-pub FILE (repeatable) gives the public keys of the hosts that sign
run attestations: a run's page in the web interface then shows whether its
attestation verifies (signature, run, every attested object re-hashed from
--store) and which key signed it. GET /v1/runs/{id}/attestation serves the
envelope itself (docs/attestation.md).

What a worker stored of a run in --store is served to the run's user: its
record (GET /v1/runs/{id}/record), change set (/patch, /changes) and files
(/files/PATH), each object up to --max-file; taskrun inspect, diff, apply
and cp read them with --server.
`

// Environment variables serve reads tokens from when no file is given.
const (
	envWorkerToken = "TASKRUN_WORKER_TOKEN"
	envUserToken   = "TASKRUN_USER_TOKEN"
)

const defaultDB = "sqlite://./.taskrun/controlplane.db"

// serveUI, when set (by the web UI's file, serveui.go), returns the handler
// serve mounts under /ui/, reading runs through r and their records from
// blobs, and the server's handler wrapped so that browsers can sign in to it.
// Its run pages check each run's attestation with keys (serve --attest-pub).
var serveUI func(r controlplane.RunReader, blobs *persist.Store, keys []*attest.Verifier, log *slog.Logger,
	liveUsage func(context.Context, controlplane.Run) (*sandbox.Usage, error)) (ui http.Handler, wrap func(http.Handler) http.Handler, err error)

type serveOptions struct {
	listen, db, store        string
	workerTokens, userTokens string
	leaseTTL, queueTTL       time.Duration
	maxWorkspace, maxOutput  int64
	maxFile                  int64
	maxima                   runlimits.Maxima
	runtimes                 []string
	attestPubs               []string
}

func init() {
	register(&command{
		Name:     "serve",
		Synopsis: "serve the control plane: user API, worker leases, metrics",
		Help:     serveHelp,
		Flags: func(fs *pflag.FlagSet) action {
			o := serveOptions{leaseTTL: 15 * time.Second, queueTTL: 24 * time.Hour, runtimes: []string{"runc", "runsc"}, maxWorkspace: server.DefaultLimits.MaxWorkspaceBytes, maxOutput: server.DefaultLimits.MaxOutputBytes, maxFile: server.DefaultLimits.MaxFileBytes}
			fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to listen on")
			fs.StringVar(&o.db, "db", defaultDB, "database: sqlite:///PATH or postgres://USER@HOST/DB")
			addStoreFlag(fs, &o.store)
			fs.StringVar(&o.workerTokens, "worker-token-file", "", `file of worker credentials, "NAME TOKEN" per line (default $`+envWorkerToken+" for one worker)")
			fs.StringVar(&o.userTokens, "user-token-file", "", `file of user tokens, "USER TOKEN" per line (default $`+envUserToken+" for user local)")
			fs.DurationVar(&o.leaseTTL, "lease-ttl", o.leaseTTL, "lease length; workers renew every third of it")
			addSizeFlag(fs, &o.maxWorkspace, "max-workspace", "largest workspace archive a submission may upload")
			addSizeFlag(fs, &o.maxOutput, "max-output", "largest output stream held per run")
			addSizeFlag(fs, &o.maxFile, "max-file", "largest stored object of a run (patch, change list, file) the user API serves")
			addRunMaximaFlags(fs, &o.maxima)
			fs.DurationVar(&o.queueTTL, "queue-ttl", o.queueTTL, "longest a run waits QUEUED before it ends FAILED, no worker having taken it (0: for ever)")
			fs.StringArrayVar(&o.attestPubs, "attest-pub", nil, "PEM public key the web interface checks runs' attestations with, as taskrun verify --key (repeatable; none: the signer is shown, not checked)")
			fs.StringSliceVar(&o.runtimes, "runtimes", o.runtimes, "OCI runtimes the workers offer; a task asking for another is refused (empty: any)")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("serve", fmt.Errorf("unexpected argument %q", args[0]))
				}
				if err := checkRunMaxima(o.maxima); err != nil {
					return a.usageError("serve", err)
				}
				return runServe(ctx, a, o)
			}
		},
	})
}

// openControlPlaneStore opens the store --db names.
func openControlPlaneStore(ctx context.Context, db string) (controlplane.Store, error) {
	switch {
	case strings.HasPrefix(db, "sqlite://"):
		return sqlite.Open(ctx, strings.TrimPrefix(db, "sqlite://"))
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		return postgres.Open(ctx, db)
	}
	return nil, fmt.Errorf("--db %q: give sqlite:///PATH or postgres://USER@HOST:PORT/DB", db)
}

func loadTokens(o serveOptions) (*server.Tokens, error) {
	var tk server.Tokens
	load := func(file, env, kind string, read func(*os.File) error, add func(string) error) error {
		if file == "" {
			if v := os.Getenv(env); v != "" {
				return add(v)
			}
			return nil
		}
		f, err := os.Open(file)
		if err != nil {
			return fmt.Errorf("%s token file: %w", kind, err)
		}
		defer f.Close()
		if err := read(f); err != nil {
			return fmt.Errorf("%s token file %s: %w", kind, file, err)
		}
		return nil
	}
	err := errors.Join(
		load(o.workerTokens, envWorkerToken, "worker", func(f *os.File) error { return tk.ReadWorkerTokens(f) },
			func(v string) error { return tk.AddWorker(server.DefaultWorker, v) }),
		load(o.userTokens, envUserToken, "user", func(f *os.File) error { return tk.ReadUserTokens(f) },
			func(v string) error { return tk.AddUser(server.DefaultUser, v) }),
	)
	if err != nil {
		return nil, err
	}
	return &tk, tk.Check()
}

func runServe(ctx context.Context, a *app, o serveOptions) int {
	if o.queueTTL < 0 {
		fmt.Fprintln(a.stderr, "taskrun serve: --queue-ttl cannot be negative")
		return exitUsage
	}
	tk, err := loadTokens(o)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun serve:", err)
		return exitUsage
	}
	var keys []*attest.Verifier
	for _, f := range o.attestPubs {
		v, err := attest.LoadVerifier(f)
		if err != nil {
			return a.usageError("serve", fmt.Errorf("--attest-pub: %w", err))
		}
		keys = append(keys, v)
	}
	store, err := openControlPlaneStore(ctx, o.db)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun serve:", err)
		return exitCannotRun
	}
	defer store.Close()
	blobs, err := persist.Open(ctx, o.store)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun serve: --store:", err)
		return exitCannotRun
	}
	defer blobs.Close()
	cfg := server.Config{Store: store, Blobs: blobs, Tokens: tk, LeaseTTL: o.leaseTTL, Log: a.log,
		QueueTTL: o.queueTTL, Runtimes: o.runtimes,
		Limits: server.Limits{MaxWorkspaceBytes: o.maxWorkspace, MaxOutputBytes: o.maxOutput, MaxFileBytes: o.maxFile}, RunMaxima: o.maxima}
	wrap := func(h http.Handler) http.Handler { return h }
	// The web interface shows a live run's usage, asked of its worker
	// through the server, which is built after it.
	var built atomic.Pointer[server.Server]
	liveUsage := func(ctx context.Context, r controlplane.Run) (*sandbox.Usage, error) {
		if s := built.Load(); s != nil {
			return s.LiveUsage(ctx, r)
		}
		return nil, nil
	}
	if serveUI != nil {
		if cfg.UI, wrap, err = serveUI(store, blobs, keys, a.log, liveUsage); err != nil {
			fmt.Fprintln(a.stderr, "taskrun serve: web interface:", err)
			return exitCannotRun
		}
	}
	srv, err := server.New(cfg)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun serve:", err)
		return exitUsage
	}
	built.Store(srv)
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		fmt.Fprintln(a.stderr, "taskrun serve: --listen:", err)
		return exitCannotRun
	}
	hs := &http.Server{Handler: wrap(srv.Handler()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go srv.Sweep(sctx)
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(shut)
	}()
	a.log.Info("control plane listening", "addr", l.Addr().String(), "db", strings.SplitN(o.db, "://", 2)[0], "store", o.store)
	if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(a.stderr, "taskrun serve:", err)
		return exitFailure
	}
	return exitOK
}
