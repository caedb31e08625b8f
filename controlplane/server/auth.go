package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/taskrun/taskrun/model"
)

// MinTokenLength is the shortest token Tokens accepts.
const MinTokenLength = 16

// DefaultUser is the user a user token without a user name acts as.
const DefaultUser = "local"

// DefaultWorker is the worker a worker token without a worker name acts as
// (a token file's one "TOKEN" line, or $TASKRUN_WORKER_TOKEN). Only one
// token may have it: every worker credential names one worker.
const DefaultWorker = "default"

// Tokens holds the bearer tokens the server accepts: worker credentials,
// each naming one worker, for the worker API, and user tokens, each acting
// as one user, for the user API. Tokens are kept as SHA-256 digests and
// compared in constant time.
//
// A worker's name is the identity its leases are bound to: a lease handed
// to one worker is refused (403) to a call made with another's credential,
// even with the lease's token. Give each worker process (or each host) its
// own credential.
type Tokens struct {
	worker []workerToken
	user   []userToken
}

type userToken struct {
	digest [32]byte
	user   string
}

type workerToken struct {
	digest [32]byte
	name   string
}

// AddWorker accepts tok as the credential of worker name.
func (t *Tokens) AddWorker(name, tok string) error {
	if err := model.ValidateID("worker", name); err != nil {
		return err
	}
	if err := checkToken(tok); err != nil {
		return fmt.Errorf("worker token of %s: %w", name, err)
	}
	d := sha256.Sum256([]byte(tok))
	for _, w := range t.worker {
		switch {
		case w.name == name && name == DefaultWorker:
			return errors.New(`two worker tokens without a name: give each worker its own credential, as "NAME TOKEN" lines`)
		case w.name == name:
			return fmt.Errorf("worker %s has two tokens: one credential per worker name", name)
		case w.digest == d:
			return fmt.Errorf("workers %s and %s share a token: give each worker its own", w.name, name)
		}
	}
	t.worker = append(t.worker, workerToken{d, name})
	return nil
}

// AddUser accepts tok as a token of user.
func (t *Tokens) AddUser(user, tok string) error {
	if err := model.ValidateID("user", user); err != nil {
		return err
	}
	if err := checkToken(tok); err != nil {
		return fmt.Errorf("user token of %s: %w", user, err)
	}
	t.user = append(t.user, userToken{sha256.Sum256([]byte(tok)), user})
	return nil
}

func checkToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("too short: use at least %d characters (e.g. openssl rand -hex 32)", MinTokenLength)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return errors.New("contains white space")
	}
	return nil
}

// Check refuses a set in which one token is both a worker's and a user's,
// or which has no token of a kind.
func (t *Tokens) Check() error {
	if len(t.worker) == 0 {
		return errors.New("no worker token: give --worker-token-file or $TASKRUN_WORKER_TOKEN")
	}
	if len(t.user) == 0 {
		return errors.New("no user token: give --user-token-file or $TASKRUN_USER_TOKEN")
	}
	for _, w := range t.worker {
		for _, u := range t.user {
			if w.digest == u.digest {
				return fmt.Errorf("a token of user %s is also a worker token: worker and user tokens must differ", u.user)
			}
		}
	}
	return nil
}

// ReadWorkerTokens adds one worker credential per line of r: "NAME TOKEN",
// or, for a single worker, just "TOKEN" (worker DefaultWorker). Blank lines
// and lines starting with # are skipped.
func (t *Tokens) ReadWorkerTokens(r io.Reader) error {
	return eachLine(r, func(fields []string) error {
		switch len(fields) {
		case 1:
			return t.AddWorker(DefaultWorker, fields[0])
		case 2:
			return t.AddWorker(fields[0], fields[1])
		}
		return errors.New(`a worker token file line is "NAME TOKEN" (or "TOKEN" for a single worker)`)
	})
}

// ReadUserTokens adds one user token per line of r: "USER TOKEN", or just
// "TOKEN" for DefaultUser.
func (t *Tokens) ReadUserTokens(r io.Reader) error {
	return eachLine(r, func(fields []string) error {
		switch len(fields) {
		case 1:
			return t.AddUser(DefaultUser, fields[0])
		case 2:
			return t.AddUser(fields[0], fields[1])
		}
		return errors.New(`a user token file line is "USER TOKEN" or "TOKEN"`)
	})
}

func eachLine(r io.Reader, f func([]string) error) error {
	sc := bufio.NewScanner(io.LimitReader(r, 1<<20))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := f(strings.Fields(line)); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}

// principal is who a request's token names: a worker (its name) or a user.
type principal struct {
	worker string
	user   string
}

// identify returns the principal of the request's bearer token; ok is false
// for a missing or unknown token. Every known token is compared, each in
// constant time, so timing does not tell which one (or how much of it) matched.
func (t *Tokens) identify(r *http.Request) (principal, bool) {
	tok, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !found || tok == "" {
		return principal{}, false
	}
	d := sha256.Sum256([]byte(tok))
	var (
		p     principal
		match int
	)
	for _, w := range t.worker {
		if subtle.ConstantTimeCompare(d[:], w.digest[:]) == 1 {
			match, p = 1, principal{worker: w.name}
		}
	}
	for _, u := range t.user {
		if subtle.ConstantTimeCompare(d[:], u.digest[:]) == 1 {
			match, p = 1, principal{user: u.user}
		}
	}
	return p, match == 1
}

type (
	userKey   struct{}
	workerKey struct{}
)

// workerFromContext returns the name of the worker a request to the worker
// API authenticated as.
func workerFromContext(ctx context.Context) string {
	w, _ := ctx.Value(workerKey{}).(string)
	return w
}

// UserFromContext returns the user a request to the user API (or to the
// mounted UI) authenticated as.
func UserFromContext(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(userKey{}).(string)
	return u, ok
}

// requireWorker admits worker tokens only: 401 without a known token, 403
// for a user token. The worker's name is in the request's context.
func (s *Server) requireWorker(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.cfg.Tokens.identify(r)
		switch {
		case !ok:
			s.unauthorized(w)
		case p.worker == "":
			writeError(w, http.StatusForbidden, "this endpoint is for workers: a user token is refused")
		default:
			h(w, r.WithContext(context.WithValue(r.Context(), workerKey{}, p.worker)))
		}
	}
}

// requireUser admits user tokens only: 401 without a known token, 403 for a
// worker token. The user is in the request's context (UserFromContext).
func (s *Server) requireUser(h http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.cfg.Tokens.identify(r)
		switch {
		case !ok:
			s.unauthorized(w)
		case p.worker != "":
			writeError(w, http.StatusForbidden, "this endpoint is for users: a worker token is refused")
		default:
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, p.user)))
		}
	}
}

func (s *Server) unauthorized(w http.ResponseWriter) {
	s.m.authFailures.Inc()
	w.Header().Set("WWW-Authenticate", `Bearer realm="taskrun"`)
	writeError(w, http.StatusUnauthorized, "missing or unknown bearer token")
}
