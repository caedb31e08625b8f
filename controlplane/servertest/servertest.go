// Package servertest starts the reference control plane (controlplane/server)
// on a loopback port for tests of its clients, such as `taskrun worker`: a
// real server on a real SQLite database (or a store the test gives), with a
// worker token, a user token, a settable clock and a hand on the lease
// sweeper.
package servertest

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/controlplane/sqlite"
	"github.com/taskrun/taskrun/persist"
)

// Tokens of the test server: two worker credentials (server.DefaultWorker
// and OtherWorker), one user token (user "alice").
const (
	WorkerToken = "servertest-worker-token-0123456789"
	UserToken   = "servertest-user-token-0123456789"
	User        = "alice"
	// OtherWorker is a second worker, with its own credential: a lease
	// handed to one worker is refused to the other.
	OtherWorker      = "other"
	OtherWorkerToken = "servertest-other-worker-token-0123"
)

// Options adjust the server. The zero value is a SQLite store in a temporary
// directory and a mem:// blob store.
type Options struct {
	// Store replaces the SQLite store (e.g. a controlplane/postgres one).
	Store controlplane.Store
	// StoreURL is the shared blob store's URL (default mem://); give a
	// file:// URL the worker under test can open too.
	StoreURL string
	// LeaseTTL is the leases' length (default 15 s).
	LeaseTTL time.Duration
	// Limits bound clients (zero fields: the server's defaults).
	Limits server.Limits
	// Log receives the server's log (default: discarded).
	Log *slog.Logger
}

// Server is a running control plane.
type Server struct {
	// URL is the base URL for workerclient.New and client.New.
	URL string
	// Server, Store and Blobs are the server and what it uses.
	Server *server.Server
	Store  controlplane.Store
	Blobs  *persist.Store
	// User is a user API client acting as User.
	User *client.Client

	mu  sync.Mutex
	now time.Time
}

// Start starts a control plane; it stops at the end of tb. The clock starts
// at the real time and moves only with Advance; leases expire only on Sweep.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	ctx := context.Background()
	if o.Store == nil {
		st, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "controlplane.db"))
		if err != nil {
			tb.Fatalf("servertest: %v", err)
		}
		tb.Cleanup(func() { st.Close() })
		o.Store = st
	}
	if o.StoreURL == "" {
		o.StoreURL = "mem://"
	}
	blobs, err := persist.Open(ctx, o.StoreURL)
	if err != nil {
		tb.Fatalf("servertest: blob store: %v", err)
	}
	tb.Cleanup(func() { blobs.Close() })
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var tk server.Tokens
	if err := tk.AddWorker(server.DefaultWorker, WorkerToken); err != nil {
		tb.Fatal(err)
	}
	if err := tk.AddWorker(OtherWorker, OtherWorkerToken); err != nil {
		tb.Fatal(err)
	}
	if err := tk.AddUser(User, UserToken); err != nil {
		tb.Fatal(err)
	}
	s := &Server{Store: o.Store, Blobs: blobs, now: time.Now()}
	srv, err := server.New(server.Config{Store: o.Store, Blobs: blobs, Tokens: &tk, LeaseTTL: o.LeaseTTL, Limits: o.Limits,
		Now: s.Now, Log: o.Log, PollInterval: 20 * time.Millisecond})
	if err != nil {
		tb.Fatalf("servertest: %v", err)
	}
	hs := httptest.NewServer(srv.Handler())
	tb.Cleanup(hs.Close)
	s.URL, s.Server = hs.URL, srv
	if s.User, err = client.New(hs.URL, UserToken, nil); err != nil {
		tb.Fatal(err)
	}
	return s
}

// Now is the server's clock.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

// Advance moves the server's clock forward by d.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
}

// Sweep runs the lease sweeper once at the server's clock: runs whose lease
// lapsed are finalized FAILED "worker lost" or requeued.
func (s *Server) Sweep(tb testing.TB) []controlplane.Expired {
	tb.Helper()
	ex, err := s.Server.SweepOnce(context.Background())
	if err != nil {
		tb.Fatalf("servertest: sweep: %v", err)
	}
	return ex
}
