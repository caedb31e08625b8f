package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/docker/go-units"
	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/controlplane/client"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/runlimits"
)

// Flags that mean the same thing in several commands are defined here, once,
// so they have one name, one default and one description everywhere.

// Defaults shared by the commands.
const (
	defaultStore        = "file://./.taskrun/store"
	defaultRoot         = "./.taskrun/runtime"
	defaultUser         = "local"
	defaultTask         = "default"
	defaultSession      = "default"
	defaultConversation = "cli"
)

const storeUsage = "blob store URL: file://DIR, s3://BUCKET (any S3-compatible store, Google Cloud Storage included) or mem://"

// addStoreFlag defines --store with the default store.
func addStoreFlag(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "store", defaultStore, storeUsage)
}

// addRootFlag defines --root, the host directory holding run directories,
// with default def.
func addRootFlag(fs *pflag.FlagSet, p *string, def string) {
	fs.StringVar(p, "root", def, "host directory holding the run directories")
}

// envToken is the environment variable --token falls back to. A run
// journals its name (never the token), so `taskrun gc` and `taskrun persist
// --all` can report to the run's control plane with the same variable set.
const envToken = "TASKRUN_TOKEN"

// serverFlags are --server and --token, the control plane a command reports to.
type serverFlags struct {
	server, token string
	// tokenFromEnv is set when the token came from $TASKRUN_TOKEN: a run
	// then journals the variable's name, so recovery can report too.
	tokenFromEnv bool
}

// serverUsage describes --server, the same in every command.
const serverUsage = "control plane base URL: run and persist report status there (without it, to the terminal); submit, runs and logs use its user API; worker leases runs from it"

func (s *serverFlags) define(fs *pflag.FlagSet) {
	fs.StringVar(&s.server, "server", "", serverUsage)
	addTokenFlag(fs, &s.token)
}

// addTokenFlag defines --token, the control plane's bearer token.
func addTokenFlag(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "token", "", "bearer token for the control plane (default $"+envToken+"; a run journals the variable's name, never the token)")
}

func (s *serverFlags) check() error {
	if s.server == "" && s.token != "" {
		return errors.New("--token needs --server")
	}
	if s.server != "" && s.token == "" {
		s.token, s.tokenFromEnv = os.Getenv(envToken), true
	}
	return nil
}

// runRefFlags name one run: --user, --conversation, --task, --session and
// --run-id.
type runRefFlags struct {
	user, conversation, task, session, runID string
}

// define adds the flags; runIDUsage says what --run-id means to the command.
func (r *runRefFlags) define(fs *pflag.FlagSet, runIDUsage string) {
	fs.StringVar(&r.user, "user", defaultUser, "user (tenant) ID")
	fs.StringVar(&r.conversation, "conversation", defaultConversation, "conversation ID")
	fs.StringVar(&r.task, "task", defaultTask, "task ID")
	fs.StringVar(&r.session, "session", defaultSession, "agent session ID")
	fs.StringVar(&r.runID, "run-id", "", runIDUsage)
}

// validate refuses IDs that are not [A-Za-z0-9_-]{1,128}, naming the flag.
func (r *runRefFlags) validate() error {
	for _, id := range []struct{ kind, v string }{
		{"--user user", r.user}, {"--conversation conversation", r.conversation},
		{"--task task", r.task}, {"--session session", r.session}, {"--run-id run", r.runID},
	} {
		if err := model.ValidateID(id.kind, id.v); err != nil {
			return err
		}
	}
	return nil
}

// ref is the run's storage reference.
func (r *runRefFlags) ref() persist.RunRef {
	return persist.RunRef{UserID: r.user, ConversationID: r.conversation, TaskID: r.task, RunID: r.runID}
}

// sizeFlag is a byte-size flag value such as 512m or 2g.
type sizeFlag struct{ p *int64 }

// addSizeFlag defines a byte-size flag stored in p, whose current value is
// its default.
func addSizeFlag(fs *pflag.FlagSet, p *int64, name, usage string) {
	fs.Var(sizeFlag{p}, name, usage)
}

func (s sizeFlag) Set(v string) error {
	n, err := units.RAMInBytes(v)
	if err != nil || n <= 0 {
		return errors.New("give a size such as 512m or 2g")
	}
	*s.p = n
	return nil
}

func (s sizeFlag) String() string {
	if s.p == nil {
		return ""
	}
	return units.BytesSize(float64(*s.p))
}

func (sizeFlag) Type() string { return "size" }

// userAPIFlags are --server and --token for commands that use the control
// plane's user API (submit, and runs and logs with --server).
type userAPIFlags struct {
	server, token string
}

func (u *userAPIFlags) define(fs *pflag.FlagSet) {
	fs.StringVar(&u.server, "server", "", serverUsage)
	addTokenFlag(fs, &u.token)
}

// client returns the user API client; the token defaults to $TASKRUN_TOKEN.
func (u *userAPIFlags) client() (*client.Client, error) {
	tok := u.token
	if tok == "" {
		tok = os.Getenv(envToken)
	}
	return client.New(u.server, tok, nil)
}

// envAttestKey names the environment variable --attest-key defaults to.
const envAttestKey = "TASKRUN_ATTEST_KEY"

// attestKeyFlag is --attest-key, the host's private key that signs every
// run's attestation.
type attestKeyFlag struct {
	path   string
	signer *attest.Signer
}

func (k *attestKeyFlag) define(fs *pflag.FlagSet) {
	fs.StringVar(&k.path, "attest-key", "", "PEM private key (ECDSA P-256 or Ed25519, PKCS #8) signing each run's attestation; it never enters a sandbox (default $"+envAttestKey+"; none: attestations are stored unsigned)")
}

// load reads the key named by the flag or $TASKRUN_ATTEST_KEY; with
// neither set there is no key and signer stays nil.
func (k *attestKeyFlag) load() error {
	if k.path == "" {
		k.path = os.Getenv(envAttestKey)
	}
	if k.path == "" {
		return nil
	}
	s, err := attest.LoadSigner(k.path)
	if err != nil {
		return fmt.Errorf("--attest-key: %w", err)
	}
	k.signer = s
	return nil
}

// addRunMaximaFlags defines the --max-run-* flags: the largest limits a
// submission may ask for per run. A submission over one is refused.
func addRunMaximaFlags(fs *pflag.FlagSet, m *runlimits.Maxima) {
	*m = runlimits.Default
	fs.DurationVar(&m.Timeout, runlimits.FlagTimeout, m.Timeout, "largest time limit a submitted run may ask for")
	addSizeFlag(fs, &m.MemoryBytes, runlimits.FlagMemory, "largest memory limit a submitted run may ask for")
	fs.Float64Var(&m.CPUs, runlimits.FlagCPUs, m.CPUs, "largest CPU limit a submitted run may ask for")
	fs.Int64Var(&m.PIDs, runlimits.FlagPIDs, m.PIDs, "largest process limit a submitted run may ask for")
	addSizeFlag(fs, &m.DiskBytes, runlimits.FlagDisk, "largest disk cap a submitted run may ask for")
	addSizeFlag(fs, &m.MaxOutputBytes, runlimits.FlagMaxOutput, "largest output cap a submitted run may ask for")
}

// checkRunMaxima refuses --max-run-* values that are not positive.
func checkRunMaxima(m runlimits.Maxima) error {
	if m.Timeout <= 0 || m.CPUs <= 0 || m.PIDs <= 0 {
		return errors.New("--max-run-timeout, --max-run-cpus and --max-run-pids must be positive")
	}
	return nil
}
