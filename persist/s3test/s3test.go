// Package s3test starts a real S3-compatible server (versitygw with its posix
// backend) for tests, so blob code is tested against the S3 protocol rather
// than a fake.
//
// Install the server once with
//
//	go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
//
// Without it, tests that need it are skipped, unless TASKRUN_REQUIRE_S3=1
// (as in CI), in which case they fail.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"go/build"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	// The URLs these helpers return open with persist.Open through this driver.
	_ "github.com/taskrun/taskrun/persist/s3"
)

// InstallCommand installs the server binary these helpers run.
const InstallCommand = "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// RequireEnv names the environment variable that turns a missing server
// binary from a skip into a failure when set to "1".
const RequireEnv = "TASKRUN_REQUIRE_S3"

const (
	// Bucket is the bucket created on every server.
	Bucket = "taskrun-test"
	// Region is the region the server and URL use.
	Region    = "us-east-1"
	accessKey = "taskrun-test-access"
	secretKey = "taskrun-test-secret-key"
	readyWait = 20 * time.Second
)

// Server is a running versitygw instance.
type Server struct {
	// URL opens the test bucket with persist.Open or blob.OpenBucket.
	URL string
	// Addr is the server's host:port on 127.0.0.1.
	Addr string

	cmd      *exec.Cmd
	exited   chan struct{}
	stopOnce sync.Once
}

// Start starts a server and returns a store URL for its bucket; see
// StartServer.
func Start(t testing.TB) string {
	t.Helper()
	return StartServer(t).URL
}

// StartServer starts versitygw on a free 127.0.0.1 port with a posix backend
// in a test temp dir, creates Bucket, sets the AWS credential environment
// variables the URL needs (so the calling test must not be parallel), and
// stops the server in t.Cleanup.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return StartServerIn(t, t.TempDir())
}

// StartServerIn is StartServer with the server's posix backend under dir
// (e.g. a small filesystem, to fill the store up).
func StartServerIn(t testing.TB, dir string) *Server {
	t.Helper()
	bin := findBinary(t)
	SetCredentialEnv(t)
	addr := ClosedAddr(t)
	root := filepath.Join(dir, "gw")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatalf("s3test: make server root: %v", err)
	}
	out := &syncWriter{}
	cmd := exec.Command(bin, "--port", addr, "--quiet", "posix", root)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+accessKey, "ROOT_SECRET_ACCESS_KEY="+secretKey)
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatalf("s3test: start %s: %v", bin, err)
	}
	srv := &Server{Addr: addr, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(srv.exited)
	}()
	t.Cleanup(srv.Stop)
	if err := srv.waitReady(); err != nil {
		t.Fatalf("s3test: %v; server output:\n%s", err, out.String())
	}
	createBucket(t, addr)
	srv.URL = fmt.Sprintf("s3://%s?endpoint=http://%s&region=%s&use_path_style=true", Bucket, addr, Region)
	return srv
}

// Stop kills the server and waits for it to exit. It is safe to call more
// than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
}

// waitReady polls the port until the server accepts connections.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyWait)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("versitygw exited before listening on %s", s.Addr)
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("versitygw not listening on %s after %v", s.Addr, readyWait)
}

// findBinary looks for versitygw on PATH, then in GOPATH/bin.
func findBinary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	for _, dir := range filepath.SplitList(build.Default.GOPATH) {
		p := filepath.Join(dir, "bin", "versitygw")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	msg := "s3test: versitygw not found on PATH or in GOPATH/bin: install it with `" + InstallCommand + "`"
	if os.Getenv(RequireEnv) == "1" {
		t.Fatal(msg + " (" + RequireEnv + "=1 requires the S3 tests)")
	}
	t.Skip(msg)
	return ""
}

// SetCredentialEnv points the AWS SDK default credential chain at the test
// server's root account, for tests that build their own s3:// URLs (e.g. an
// unreachable endpoint). The calling test must not be parallel.
func SetCredentialEnv(t testing.TB) {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", accessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "no-aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "no-aws-credentials"))
}

// ClosedAddr returns a 127.0.0.1 address whose port was free just now: a
// port for a new server, or an endpoint on which nothing listens.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("s3test: find a free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("s3test: release port: %v", err)
	}
	return addr
}

// createBucket creates Bucket through the S3 API.
func createBucket(t testing.TB, addr string) {
	t.Helper()
	client := s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String("http://" + addr),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
	})
	ctx, cancel := context.WithTimeout(context.Background(), readyWait)
	defer cancel()
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(Bucket)}); err != nil {
		t.Fatalf("s3test: create bucket %s: %v", Bucket, err)
	}
}

// syncWriter collects server output from the process's copying goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}
