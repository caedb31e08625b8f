// Package pgtest runs a throwaway PostgreSQL cluster for tests, from the
// host's own PostgreSQL binaries (Debian's postgresql package): initdb into a
// temporary directory, pg_ctl start on a free loopback port with the socket in
// that directory, and pg_ctl stop plus removal at the end. As root the cluster
// runs as the "postgres" user (PostgreSQL refuses root) via runuser.
//
// One cluster per test package: call Main from TestMain and Shared from each
// test; NewDatabase gives every test its own database in it.
//
// Without PostgreSQL the tests skip, unless TASKRUN_REQUIRE_POSTGRES=1 (set
// in CI by the Makefile), where they fail.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// EnvRequire names the variable that turns a missing PostgreSQL into a
// test failure instead of a skip.
const EnvRequire = "TASKRUN_REQUIRE_POSTGRES"

// ErrNoPostgres is returned when no PostgreSQL server binaries are found.
var ErrNoPostgres = errors.New("pgtest: PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's postgresql package (scripts/test-setup.sh does, as root)")

// Cluster is a running throwaway PostgreSQL cluster.
type Cluster struct {
	dir  string
	bin  string
	port int
	// runAs prefixes commands so they run as the cluster's owner.
	runAs []string
	dbs   atomic.Int64
}

// findBin returns the directory of initdb and pg_ctl: Debian keeps them in
// /usr/lib/postgresql/VERSION/bin, newest first; else $PATH.
func findBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNoPostgres
}

// tempBase is where the cluster's directory goes: the usual temporary
// directory, unless running as root with one the postgres user cannot reach
// (such as a TMPDIR under /root); then /tmp.
func tempBase() string {
	base := os.TempDir()
	if os.Geteuid() != 0 {
		return base
	}
	for d := base; ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == filepath.Dir(d) {
			return base
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start creates and starts a cluster. Stop it with Stop.
func Start(ctx context.Context) (*Cluster, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempBase(), "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs the postgres user (Debian's postgresql package creates it): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		c.runAs = []string{"runuser", "-u", "postgres", "--"}
	}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	argv := append(append(append([]string{}, c.runAs...), filepath.Join(c.bin, name)), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: %s: %w\n%s", name, err, out)
	}
	return nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) start(ctx context.Context) error {
	if err := c.run(ctx, "initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return err
	}
	var err error
	for range 5 {
		if c.port, err = freePort(); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if err = c.serve(ctx); err == nil {
			return nil
		}
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
	return fmt.Errorf("%w\nserver log:\n%s", err, log)
}

// serve starts the server on c.port and waits until it accepts connections.
func (c *Cluster) serve(ctx context.Context) error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB", c.port, c.dir)
	return c.run(ctx, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", opts, "start")
}

// Halt stops the cluster's server at once (every connection is cut) and
// keeps its files: a database outage, which Resume ends. Halt a cluster of
// the test's own (Start), not the shared one.
func (c *Cluster) Halt(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
}

// Resume starts the server Halt stopped, on the same port, with the same
// databases.
func (c *Cluster) Resume(ctx context.Context) error {
	return c.serve(ctx)
}

// Stop stops the cluster at once and removes its files.
func (c *Cluster) Stop() {
	if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = c.run(ctx, "pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
		cancel()
	}
	os.RemoveAll(c.dir)
}

// DSN returns the connection string of database db on the cluster.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// NewDatabase creates a fresh, empty database and returns its DSN.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), c.dbs.Add(1))
	db, err := sql.Open("pgx", c.DSN("postgres"))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	return c.DSN(name)
}

var (
	shared     *Cluster
	sharedErr  error
	sharedOnce sync.Once
	sharedMu   sync.Mutex
)

// Shared returns the package's cluster, started on first use. Without
// PostgreSQL it skips tb, or fails it when EnvRequire is set.
func Shared(tb testing.TB) *Cluster {
	tb.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sharedMu.Lock()
		shared, sharedErr = Start(ctx)
		sharedMu.Unlock()
	})
	if sharedErr != nil {
		if errors.Is(sharedErr, ErrNoPostgres) && os.Getenv(EnvRequire) != "1" {
			tb.Skip(sharedErr)
		}
		tb.Fatal(sharedErr)
	}
	return shared
}

// Main runs the package's tests and stops the shared cluster afterwards:
// call os.Exit(pgtest.Main(m)) from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		shared.Stop()
	}
	return code
}
