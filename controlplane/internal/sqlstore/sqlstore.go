// Package sqlstore implements controlplane.Store over database/sql for the
// two SQL backends, which differ only in what their Dialect says: placeholder
// syntax, row locking and how migrations are serialized. The backends'
// packages (controlplane/sqlite, controlplane/postgres) open the database,
// apply their embedded migrations and wrap a Store.
package sqlstore

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Dialect is what differs between the SQL backends.
type Dialect struct {
	// Name names the backend in errors ("sqlite", "postgres").
	Name string
	// Numbered placeholders ($1, $2, ...) instead of ?.
	Numbered bool
	// LockRows is appended to a SELECT of runs to lock the rows read for the
	// rest of the transaction ("FOR UPDATE OF r"); empty where the whole
	// database has one writer.
	LockRows string
	// SkipLocked is appended to a SELECT of runs to lock the rows read, passing
	// over rows another transaction holds ("FOR UPDATE OF r SKIP LOCKED").
	SkipLocked string
	// SchemaVersion is the latest migration's version: Ready checks it.
	SchemaVersion int
}

// lease states: whether the run's current epoch still speaks for it.
const (
	leaseNone     = ""         // never leased
	leaseHeld     = "held"     // leased, until lease_expires_at
	leaseReleased = "released" // the holder reported a terminal status
	leaseLost     = "lost"     // expired: the epoch is dead
)

// candidates is how many queued runs one lease call considers.
const candidates = 64

// maxReadChunks bounds the chunks one ReadOutput reads.
const maxReadChunks = 64

// Store is a controlplane.Store on a SQL database.
type Store struct {
	db *sql.DB
	d  Dialect
}

// New wraps db, whose schema is already migrated.
func New(db *sql.DB, d Dialect) *Store { return &Store{db: db, d: d} }

// DB returns the database handle.
func (s *Store) DB() *sql.DB { return s.db }

// q rewrites ? placeholders for the dialect.
func (s *Store) q(query string) string {
	if !s.d.Numbered {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *Store) tx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", s.d.Name, err)
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", s.d.Name, err)
	}
	return nil
}

const runCols = `r.id, r.task_id, t.user_id, t.conversation_id, CASE WHEN r.prompt <> '' THEN r.prompt ELSE t.prompt END, t.spec, r.session_id, r.previous_run_id,
r.status, r.created_at, r.leased_at, r.started_at, r.ended_at, r.worker_id, r.epoch, r.lease_expires_at, r.lease_state,
r.cancel_requested, r.attempts, r.exit_code, r.error, r.prompt_tokens, r.completion_tokens, r.output, r.output_truncated,
r.trace_path, r.artifact, r.changes, r.container, r.stream_next, r.stream_ended, r.lease_holder, r.lease_token_hash, r.resume, r.parent_run_id`

const runFrom = ` FROM runs r JOIN tasks t ON t.id = r.task_id `

// row is a scanned run plus the columns only the store uses.
type row struct {
	controlplane.Run
	leaseState string
	// holder and tokenHash (hex SHA-256) bind the current lease.
	holder, tokenHash string
}

type scanner interface{ Scan(...any) error }

func ms(t time.Time) int64 { return t.UnixMilli() }

func tptr(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := time.UnixMilli(n.Int64).UTC()
	return &t
}

func scanRun(sc scanner) (row, error) {
	var (
		r                                      row
		spec, artifact, changes, container     string
		created                                int64
		leased, started, ended, expires, exitC sql.NullInt64
		cancel, truncated, ended2, resume      int
	)
	err := sc.Scan(&r.ID, &r.Task.ID, &r.Task.UserID, &r.Task.ConversationID, &r.Task.Prompt, &spec, &r.SessionID, &r.PreviousRunID,
		&r.Status, &created, &leased, &started, &ended, &r.WorkerID, &r.Epoch, &expires, &r.leaseState,
		&cancel, &r.Attempts, &exitC, &r.Error, &r.PromptTokens, &r.CompletionTokens, &r.Output, &truncated,
		&r.TracePath, &artifact, &changes, &container, &r.StreamNext, &ended2, &r.holder, &r.tokenHash, &resume, &r.ParentRunID)
	if err != nil {
		return row{}, err
	}
	r.CreatedAt = time.UnixMilli(created).UTC()
	r.LeasedAt, r.StartedAt, r.EndedAt, r.LeaseExpiresAt = tptr(leased), tptr(started), tptr(ended), tptr(expires)
	r.CancelRequested, r.OutputTruncated, r.StreamEnded, r.Resume = cancel != 0, truncated != 0, ended2 != 0, resume != 0
	if exitC.Valid {
		c := int(exitC.Int64)
		r.ExitCode = &c
	}
	if err := json.Unmarshal([]byte(spec), &r.Spec); err != nil {
		return row{}, fmt.Errorf("decode spec of run %s: %w", r.ID, err)
	}
	for _, j := range []struct {
		s   string
		dst any
	}{{artifact, &r.Artifact}, {changes, &r.Changes}, {container, &r.Container}} {
		if j.s == "" {
			continue
		}
		if err := json.Unmarshal([]byte(j.s), j.dst); err != nil {
			return row{}, fmt.Errorf("decode run %s: %w", r.ID, err)
		}
	}
	return r, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// getRow reads one run inside tx, locking its row where the dialect can.
func (s *Store) getRow(ctx context.Context, tx *sql.Tx, id string) (row, error) {
	r, err := scanRun(tx.QueryRowContext(ctx, s.q("SELECT "+runCols+runFrom+"WHERE r.id = ? "+s.d.LockRows), id))
	if errors.Is(err, sql.ErrNoRows) {
		return row{}, fmt.Errorf("run %q: %w", id, controlplane.ErrNotFound)
	}
	if err != nil {
		return row{}, fmt.Errorf("%s: read run %s: %w", s.d.Name, id, err)
	}
	return r, nil
}

// CreateTask implements controlplane.Store.
func (s *Store) CreateTask(ctx context.Context, t controlplane.NewTask) (controlplane.Run, error) {
	spec, err := json.Marshal(t.Spec)
	if err != nil {
		return controlplane.Run{}, fmt.Errorf("encode spec: %w", err)
	}
	now := ms(t.CreatedAt)
	var out row
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO tasks (id, user_id, conversation_id, prompt, spec, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
			t.Task.ID, t.Task.UserID, t.Task.ConversationID, t.Task.Prompt, string(spec), now); err != nil {
			return fmt.Errorf("%s: insert task %s: %w", s.d.Name, t.Task.ID, err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO runs (id, task_id, session_id, previous_run_id, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
			t.RunID, t.Task.ID, t.SessionID, t.PreviousRunID, string(model.StatusQueued), now); err != nil {
			return fmt.Errorf("%s: insert run %s: %w", s.d.Name, t.RunID, err)
		}
		out, err = s.getRow(ctx, tx, t.RunID)
		return err
	})
	return out.Run, err
}

// GetRun implements controlplane.RunReader.
func (s *Store) GetRun(ctx context.Context, id string) (controlplane.Run, error) {
	r, err := scanRun(s.db.QueryRowContext(ctx, s.q("SELECT "+runCols+runFrom+"WHERE r.id = ?"), id))
	if errors.Is(err, sql.ErrNoRows) {
		return controlplane.Run{}, fmt.Errorf("run %q: %w", id, controlplane.ErrNotFound)
	}
	if err != nil {
		return controlplane.Run{}, fmt.Errorf("%s: read run %s: %w", s.d.Name, id, err)
	}
	return r.Run, nil
}

// ListRuns implements controlplane.RunReader.
func (s *Store) ListRuns(ctx context.Context, f controlplane.RunFilter) ([]controlplane.Run, error) {
	limit := f.Limit
	if limit <= 0 || limit > controlplane.MaxListLimit {
		limit = controlplane.MaxListLimit
	}
	where, args := []string{"1 = 1"}, []any{}
	if f.UserID != "" {
		where, args = append(where, "t.user_id = ?"), append(args, f.UserID)
	}
	if f.Status != "" {
		where, args = append(where, "r.status = ?"), append(args, string(f.Status))
	}
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, s.q("SELECT "+runCols+runFrom+"WHERE "+strings.Join(where, " AND ")+" ORDER BY r.created_at DESC, r.id DESC LIMIT ?"), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: list runs: %w", s.d.Name, err)
	}
	defer rows.Close()
	var out []controlplane.Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: list runs: %w", s.d.Name, err)
		}
		out = append(out, r.Run)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list runs: %w", s.d.Name, err)
	}
	return out, nil
}

// Lease implements controlplane.Store. It reads the oldest queued runs
// without locking them, and takes the first that fits and that no concurrent
// lease holds (SKIP LOCKED on its row alone), so concurrent callers never
// wait on each other nor hide from each other the runs they pass over. When
// concurrent leases took every fitting run it read, it reads the queue again
// (a few times), so a caller is not told "nothing" while runs wait.
func (s *Store) Lease(ctx context.Context, o controlplane.LeaseOffer) (*controlplane.Run, error) {
	var got *controlplane.Run
	err := s.tx(ctx, func(tx *sql.Tx) error {
		for range leaseRounds {
			fit, err := s.fittingQueued(ctx, tx, o.Fits)
			if err != nil || len(fit) == 0 {
				return err
			}
			for _, id := range fit {
				if got, err = s.take(ctx, tx, id, o); err != nil || got != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

// leaseRounds bounds how often one Lease reads the queue.
const leaseRounds = 4

// fittingQueued returns the IDs of the oldest queued runs that fit, oldest
// first, without locking them.
func (s *Store) fittingQueued(ctx context.Context, tx *sql.Tx, fits func(controlplane.Run) bool) ([]string, error) {
	rows, err := tx.QueryContext(ctx, s.q("SELECT "+runCols+runFrom+"WHERE r.status = ? ORDER BY r.created_at, r.id LIMIT ?"),
		string(model.StatusQueued), candidates)
	if err != nil {
		return nil, fmt.Errorf("%s: read queue: %w", s.d.Name, err)
	}
	defer rows.Close()
	var fit []string
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: read queue: %w", s.d.Name, err)
		}
		if fits == nil || fits(r.Run) {
			fit = append(fit, r.ID)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: read queue: %w", s.d.Name, err)
	}
	return fit, nil
}

// take leases run id to o if it is still queued and no concurrent lease
// holds it; nil when it is not available.
func (s *Store) take(ctx context.Context, tx *sql.Tx, id string, o controlplane.LeaseOffer) (*controlplane.Run, error) {
	var locked string
	err := tx.QueryRowContext(ctx, s.q("SELECT r.id FROM runs r WHERE r.id = ? AND r.status = ? "+s.d.SkipLocked), id, string(model.StatusQueued)).Scan(&locked)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil // leased or cancelled meanwhile, or held by a concurrent lease
	}
	if err != nil {
		return nil, fmt.Errorf("%s: lock run %s: %w", s.d.Name, id, err)
	}
	if o.Holder == "" || o.TokenHash == ([32]byte{}) {
		return nil, fmt.Errorf("%s: lease run %s: the offer names no holder or token", s.d.Name, id)
	}
	res, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, epoch = epoch + 1, worker_id = ?, leased_at = ?, lease_expires_at = ?,
lease_state = ?, attempts = attempts + 1, cancel_requested = 0, lease_holder = ?, lease_token_hash = ? WHERE id = ? AND status = ?`),
		string(model.StatusRunning), o.WorkerID, ms(o.Now), ms(o.Now.Add(o.TTL)), leaseHeld, o.Holder, hex.EncodeToString(o.TokenHash[:]),
		id, string(model.StatusQueued))
	if err != nil {
		return nil, fmt.Errorf("%s: lease run %s: %w", s.d.Name, id, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return nil, nil
	}
	r, err := s.getRow(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	return &r.Run, nil
}

// fencedRow is run id's row, locked in tx, once f speaks for it at now
// (fenced).
func (s *Store) fencedRow(ctx context.Context, tx *sql.Tx, id string, f controlplane.Fence, now time.Time, allowReleased bool) (row, error) {
	r, err := s.getRow(ctx, tx, id)
	if err != nil {
		return row{}, err
	}
	if err := fenced(r, f, now, allowReleased); err != nil {
		return row{}, err
	}
	return r, nil
}

// fenced checks that f speaks for r at now: the current epoch, the current
// lease's token and holder (ErrNotHolder otherwise), and a live lease.
// Released leases are allowed when allowReleased (a repeated terminal PATCH,
// the stream's tail).
func fenced(r row, f controlplane.Fence, now time.Time, allowReleased bool) error {
	sum := hex.EncodeToString(f.TokenHash[:])
	token := subtle.ConstantTimeCompare([]byte(sum), []byte(r.tokenHash))
	holder := subtle.ConstantTimeCompare([]byte(f.Holder), []byte(r.holder))
	released := r.leaseState == leaseReleased && allowReleased
	switch {
	case f.Epoch <= 0 || f.Epoch != r.Epoch:
		return fmt.Errorf("run %s: epoch %d, current %d: %w", r.ID, f.Epoch, r.Epoch, controlplane.ErrStaleFence)
	case r.leaseState != leaseHeld && !released:
		return fmt.Errorf("run %s: lease %q: %w", r.ID, r.leaseState, controlplane.ErrStaleFence)
	case token&holder != 1 || r.holder == "":
		return fmt.Errorf("run %s: epoch %d: %w", r.ID, f.Epoch, controlplane.ErrNotHolder)
	case released:
		return nil
	case r.LeaseExpiresAt == nil || !now.Before(*r.LeaseExpiresAt):
		return fmt.Errorf("run %s: lease expired: %w", r.ID, controlplane.ErrStaleFence)
	}
	return nil
}

// RecordWorker implements controlplane.Store.
func (s *Store) RecordWorker(ctx context.Context, w controlplane.Worker) error {
	capacity, err := json.Marshal(w.Capacity)
	if err != nil {
		return fmt.Errorf("%s: record worker %s: %w", s.d.Name, w.ID, err)
	}
	labels, err := json.Marshal(w.Labels)
	if err != nil {
		return fmt.Errorf("%s: record worker %s: %w", s.d.Name, w.ID, err)
	}
	// A replica whose clock lags never moves a heartbeat back.
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO workers (id, capacity, labels, last_seen) VALUES (?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET capacity = excluded.capacity, labels = excluded.labels, last_seen = excluded.last_seen
WHERE excluded.last_seen >= workers.last_seen`), w.ID, string(capacity), string(labels), ms(w.LastSeen))
	if err != nil {
		return fmt.Errorf("%s: record worker %s: %w", s.d.Name, w.ID, err)
	}
	return nil
}

// ListWorkers implements controlplane.WorkerReader.
func (s *Store) ListWorkers(ctx context.Context, since time.Time) ([]controlplane.Worker, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, capacity, labels, last_seen FROM workers WHERE last_seen >= ? ORDER BY last_seen DESC, id LIMIT ?`),
		ms(since), controlplane.MaxWorkers)
	if err != nil {
		return nil, fmt.Errorf("%s: list workers: %w", s.d.Name, err)
	}
	defer rows.Close()
	var out []controlplane.Worker
	for rows.Next() {
		var w controlplane.Worker
		var capacity, labels string
		var seen int64
		if err := rows.Scan(&w.ID, &capacity, &labels, &seen); err != nil {
			return nil, fmt.Errorf("%s: list workers: %w", s.d.Name, err)
		}
		if err := json.Unmarshal([]byte(capacity), &w.Capacity); err != nil {
			return nil, fmt.Errorf("%s: worker %s: capacity: %w", s.d.Name, w.ID, err)
		}
		if err := json.Unmarshal([]byte(labels), &w.Labels); err != nil {
			return nil, fmt.Errorf("%s: worker %s: labels: %w", s.d.Name, w.ID, err)
		}
		w.LastSeen = time.UnixMilli(seen).UTC()
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list workers: %w", s.d.Name, err)
	}
	return out, nil
}

// ReturnLease implements controlplane.Store.
func (s *Store) ReturnLease(ctx context.Context, id string, epoch int64, now time.Time) (bool, error) {
	var back bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		r, err := s.getRow(ctx, tx, id)
		if err != nil {
			return err
		}
		// A resumed run started and streamed before its pause: what its
		// new worker reported cannot be told from that, but an undelivered
		// lease's worker never had its token to report anything.
		spoke := !r.Resume && (r.StartedAt != nil || r.StreamNext > 0)
		if r.Epoch != epoch || r.leaseState != leaseHeld || r.Status != model.StatusRunning || spoke {
			return nil // not this lease's to return, or its worker already spoke
		}
		var res sql.Result
		if r.CancelRequested {
			res, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, ended_at = ?, lease_state = ?, lease_expires_at = NULL
WHERE id = ? AND epoch = ? AND lease_state = ?`),
				string(model.StatusCancelled), ms(now), leaseLost, id, epoch, leaseHeld)
		} else {
			res, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, lease_state = ?, lease_expires_at = NULL, leased_at = NULL,
worker_id = '', attempts = attempts - 1 WHERE id = ? AND epoch = ? AND lease_state = ?`),
				string(model.StatusQueued), leaseLost, id, epoch, leaseHeld)
		}
		if err != nil {
			return fmt.Errorf("%s: return lease of %s: %w", s.d.Name, id, err)
		}
		n, _ := res.RowsAffected()
		back = n == 1
		return nil
	})
	return back, err
}

// Renew implements controlplane.Store.
func (s *Store) Renew(ctx context.Context, id string, f controlplane.Fence, now time.Time, ttl time.Duration) (controlplane.Run, error) {
	var out controlplane.Run
	err := s.tx(ctx, func(tx *sql.Tx) error {
		r, err := s.fencedRow(ctx, tx, id, f, now, false)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET lease_expires_at = ? WHERE id = ?`), ms(now.Add(ttl)), id); err != nil {
			return fmt.Errorf("%s: renew %s: %w", s.d.Name, id, err)
		}
		r, err = s.getRow(ctx, tx, id)
		out = r.Run
		return err
	})
	return out, err
}

// Patch implements controlplane.Store.
func (s *Store) Patch(ctx context.Context, id string, f controlplane.Fence, now time.Time, p workerclient.PatchTaskRunRequest) (controlplane.Run, bool, error) {
	var (
		out     controlplane.Run
		changed bool
	)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		r, err := s.fencedRow(ctx, tx, id, f, now, true)
		if err != nil {
			return err
		}
		if r.leaseState == leaseReleased || r.Status.Terminal() {
			out = r.Run // the first terminal status wins
			return nil
		}
		set, args := []string{"status = ?"}, []any{string(p.Status)}
		add := func(col string, v any) { set, args = append(set, col+" = ?"), append(args, v) }
		if p.StartedAt != nil {
			add("started_at", *p.StartedAt)
		}
		if p.EndedAt != nil {
			add("ended_at", *p.EndedAt)
		}
		if p.Output != nil {
			add("output", *p.Output)
			add("output_truncated", b2i(p.OutputTruncated))
		}
		if p.Error != nil {
			add("error", *p.Error)
		}
		if p.ExitCode != nil {
			add("exit_code", *p.ExitCode)
		}
		if p.PromptTokens != nil {
			add("prompt_tokens", *p.PromptTokens)
		}
		if p.CompletionTokens != nil {
			add("completion_tokens", *p.CompletionTokens)
		}
		if p.TracePath != nil {
			add("trace_path", *p.TracePath)
		}
		for _, j := range []struct {
			col string
			v   any
			set bool
		}{{"artifact", p.Artifact, p.Artifact != nil}, {"changes", p.Changes, p.Changes != nil}, {"container", p.Container, p.Container != nil}} {
			if !j.set {
				continue
			}
			b, err := json.Marshal(j.v)
			if err != nil {
				return fmt.Errorf("encode %s: %w", j.col, err)
			}
			add(j.col, string(b))
		}
		if p.Status.Terminal() || p.Status == model.StatusPaused {
			// A paused run's worker holds nothing of it: its lease ends
			// without it lapsing into a lost worker's FAILED or QUEUED.
			add("lease_state", leaseReleased)
			set = append(set, "lease_expires_at = NULL")
			if p.EndedAt == nil && p.Status.Terminal() {
				add("ended_at", ms(now))
			}
		}
		args = append(args, id)
		if _, err := tx.ExecContext(ctx, s.q("UPDATE runs SET "+strings.Join(set, ", ")+" WHERE id = ?"), args...); err != nil {
			return fmt.Errorf("%s: patch %s: %w", s.d.Name, id, err)
		}
		changed = true
		r, err = s.getRow(ctx, tx, id)
		out = r.Run
		return err
	})
	return out, changed, err
}

// held returns the bytes of the stream held in [from, to).
func (s *Store) held(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, id string, from, to int64, maxChunks int) ([]byte, error) {
	rows, err := q.QueryContext(ctx, s.q(`SELECT off, data FROM output_chunks WHERE run_id = ? AND off < ? AND off + length(data) > ? ORDER BY off LIMIT ?`),
		id, to, from, maxChunks)
	if err != nil {
		return nil, fmt.Errorf("%s: read output of %s: %w", s.d.Name, id, err)
	}
	defer rows.Close()
	var out []byte
	for rows.Next() {
		var (
			off  int64
			data []byte
		)
		if err := rows.Scan(&off, &data); err != nil {
			return nil, fmt.Errorf("%s: read output of %s: %w", s.d.Name, id, err)
		}
		start := max(from, off) - off
		end := min(to, off+int64(len(data))) - off
		if int64(len(out))+from != max(from, off) {
			break // a hole: cannot happen, chunks are contiguous
		}
		out = append(out, data[start:end]...)
	}
	return out, rows.Err()
}

// AppendOutput implements controlplane.Store.
func (s *Store) AppendOutput(ctx context.Context, id string, f controlplane.Fence, now time.Time, off int64, data []byte, maxBytes int64) (int64, error) {
	var next int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		r, err := s.fencedRow(ctx, tx, id, f, now, true)
		if err != nil {
			return err
		}
		next = r.StreamNext
		end := off + int64(len(data))
		switch {
		case off < 0:
			return fmt.Errorf("offset %d: %w", off, controlplane.ErrConflict)
		case off > next:
			return fmt.Errorf("gap: offset %d, held %d: %w", off, next, controlplane.ErrConflict)
		case r.StreamEnded && end > next:
			return fmt.Errorf("bytes past the stream's end at %d: %w", next, controlplane.ErrConflict)
		}
		if off < next {
			overlap := min(end, next)
			have, err := s.held(ctx, tx, id, off, overlap, 1<<20)
			if err != nil {
				return err
			}
			if string(have) != string(data[:overlap-off]) {
				return fmt.Errorf("bytes at %d differ from those held: %w", off, controlplane.ErrConflict)
			}
		}
		if end <= next {
			return nil
		}
		fresh := data[next-off:]
		if maxBytes > 0 && end > maxBytes {
			return fmt.Errorf("run %s output would reach %d bytes, over the cap of %d: %w", id, end, maxBytes, controlplane.ErrTooLarge)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO output_chunks (run_id, off, data) VALUES (?, ?, ?)`), id, next, fresh); err != nil {
			return fmt.Errorf("%s: append output of %s: %w", s.d.Name, id, err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET stream_next = ? WHERE id = ?`), end, id); err != nil {
			return fmt.Errorf("%s: append output of %s: %w", s.d.Name, id, err)
		}
		next = end
		return nil
	})
	return next, err
}

// EndOutput implements controlplane.Store.
func (s *Store) EndOutput(ctx context.Context, id string, f controlplane.Fence, now time.Time, total int64) (int64, error) {
	var next int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		r, err := s.fencedRow(ctx, tx, id, f, now, true)
		if err != nil {
			return err
		}
		next = r.StreamNext
		if total != next {
			return fmt.Errorf("end at %d, held %d: %w", total, next, controlplane.ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET stream_ended = 1 WHERE id = ?`), id); err != nil {
			return fmt.Errorf("%s: end output of %s: %w", s.d.Name, id, err)
		}
		return nil
	})
	return next, err
}

// ReadOutput implements controlplane.RunReader.
func (s *Store) ReadOutput(ctx context.Context, id string, offset int64, maxBytes int) ([]byte, controlplane.Run, error) {
	r, err := s.GetRun(ctx, id)
	if err != nil {
		return nil, r, err
	}
	if offset >= r.StreamNext || maxBytes <= 0 {
		return nil, r, nil
	}
	data, err := s.held(ctx, s.db, id, offset, min(r.StreamNext, offset+int64(maxBytes)), maxReadChunks)
	return data, r, err
}

// Cancel implements controlplane.Store.
func (s *Store) Cancel(ctx context.Context, id string, now time.Time) (controlplane.Run, error) {
	var out controlplane.Run
	err := s.tx(ctx, func(tx *sql.Tx) error {
		r, err := s.getRow(ctx, tx, id)
		if err != nil {
			return err
		}
		switch {
		case r.Status.Terminal():
			return fmt.Errorf("run %s is %s: %w", id, r.Status, controlplane.ErrFinished)
		case r.Status == model.StatusQueued:
			_, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, ended_at = ?, error = ?, cancel_requested = 1 WHERE id = ?`),
				string(model.StatusCancelled), ms(now), "cancelled before a worker took it", id)
		case r.Status == model.StatusPaused:
			// No worker holds a paused run: it ends here.
			_, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, ended_at = ?, error = ?, cancel_requested = 1 WHERE id = ?`),
				string(model.StatusCancelled), ms(now), "cancelled while paused", id)
		default:
			_, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET cancel_requested = 1 WHERE id = ?`), id)
		}
		if err != nil {
			return fmt.Errorf("%s: cancel %s: %w", s.d.Name, id, err)
		}
		r, err = s.getRow(ctx, tx, id)
		out = r.Run
		return err
	})
	return out, err
}

// Resume implements controlplane.Store: one conditional UPDATE, so of
// concurrent resumes of a paused run exactly one finds it PAUSED.
func (s *Store) Resume(ctx context.Context, id string, _ time.Time) (controlplane.Run, error) {
	var out controlplane.Run
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, resume = 1, stream_ended = 0, cancel_requested = 0
WHERE id = ? AND status = ?`), string(model.StatusQueued), id, string(model.StatusPaused))
		if err != nil {
			return fmt.Errorf("%s: resume %s: %w", s.d.Name, id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("%s: resume %s: %w", s.d.Name, id, err)
		}
		r, err := s.getRow(ctx, tx, id)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("run %s is %s, not PAUSED: %w", id, r.Status, controlplane.ErrConflict)
		}
		out = r.Run
		return nil
	})
	return out, err
}

// Fork implements controlplane.Store.
func (s *Store) Fork(ctx context.Context, parent string, ids []string, prompt string, now time.Time) ([]controlplane.Run, error) {
	var out []controlplane.Run
	err := s.tx(ctx, func(tx *sql.Tx) error {
		p, err := s.getRow(ctx, tx, parent)
		if err != nil {
			return err
		}
		if p.Status != model.StatusPaused && !p.Status.Terminal() {
			return fmt.Errorf("run %s is %s: fork a PAUSED or ended run: %w", parent, p.Status, controlplane.ErrConflict)
		}
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO runs (id, task_id, session_id, previous_run_id, status, created_at, parent_run_id, prompt)
VALUES (?, ?, ?, '', ?, ?, ?, ?)`), id, p.Task.ID, p.SessionID, string(model.StatusQueued), ms(now), parent, prompt); err != nil {
				return fmt.Errorf("%s: insert fork %s of %s: %w", s.d.Name, id, parent, err)
			}
			r, err := s.getRow(ctx, tx, id)
			if err != nil {
				return err
			}
			out = append(out, r.Run)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ExpireLeases implements controlplane.Store.
func (s *Store) ExpireLeases(ctx context.Context, now time.Time) ([]controlplane.Expired, error) {
	var out []controlplane.Expired
	err := s.tx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.q("SELECT "+runCols+runFrom+"WHERE r.lease_state = ? AND r.lease_expires_at <= ? ORDER BY r.lease_expires_at LIMIT 256 "+s.d.SkipLocked),
			leaseHeld, ms(now))
		if err != nil {
			return fmt.Errorf("%s: find expired leases: %w", s.d.Name, err)
		}
		var lapsed []row
		for rows.Next() {
			r, err := scanRun(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("%s: find expired leases: %w", s.d.Name, err)
			}
			lapsed = append(lapsed, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: find expired leases: %w", s.d.Name, err)
		}
		for _, r := range lapsed {
			e := controlplane.Expired{RunID: r.ID}
			switch {
			case r.CancelRequested:
				e.Status = model.StatusCancelled
				_, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, ended_at = ?, error = ?, lease_state = ?, lease_expires_at = NULL WHERE id = ?`),
					string(e.Status), ms(now), "cancelled; "+controlplane.ErrorWorkerLost, leaseLost, r.ID)
			case r.Spec.Retryable && r.Attempts < controlplane.MaxAttempts:
				e.Status, e.Requeued = model.StatusQueued, true
				_, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, lease_state = ?, lease_expires_at = NULL, started_at = NULL,
stream_next = 0, stream_ended = 0, container = '', output = '', output_truncated = 0 WHERE id = ?`),
					string(e.Status), leaseLost, r.ID)
				if err == nil {
					_, err = tx.ExecContext(ctx, s.q(`DELETE FROM output_chunks WHERE run_id = ?`), r.ID)
				}
			default:
				e.Status = model.StatusFailed
				msg := controlplane.ErrorWorkerLost
				if r.Spec.Retryable {
					msg = fmt.Sprintf("%s (%d attempts)", msg, r.Attempts)
				}
				_, err = tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, ended_at = ?, error = ?, lease_state = ?, lease_expires_at = NULL WHERE id = ?`),
					string(e.Status), ms(now), msg, leaseLost, r.ID)
			}
			if err != nil {
				return fmt.Errorf("%s: expire lease of %s: %w", s.d.Name, r.ID, err)
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ExpireQueued implements controlplane.Store.
func (s *Store) ExpireQueued(ctx context.Context, before, now time.Time, reason string) ([]string, error) {
	var ids []string
	err := s.tx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.q("SELECT r.id FROM runs r WHERE r.status = ? AND r.resume = 0 AND r.created_at < ? ORDER BY r.created_at LIMIT 256 "+s.d.SkipLocked),
			string(model.StatusQueued), ms(before))
		if err != nil {
			return fmt.Errorf("%s: find expired queued runs: %w", s.d.Name, err)
		}
		var stale []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return fmt.Errorf("%s: find expired queued runs: %w", s.d.Name, err)
			}
			stale = append(stale, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: find expired queued runs: %w", s.d.Name, err)
		}
		for _, id := range stale {
			res, err := tx.ExecContext(ctx, s.q(`UPDATE runs SET status = ?, ended_at = ?, error = ? WHERE id = ? AND status = ?`),
				string(model.StatusFailed), ms(now), reason, id, string(model.StatusQueued))
			if err != nil {
				return fmt.Errorf("%s: expire queued run %s: %w", s.d.Name, id, err)
			}
			if n, err := res.RowsAffected(); err == nil && n == 1 {
				ids = append(ids, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// CountByStatus implements controlplane.Store.
func (s *Store) CountByStatus(ctx context.Context, userID string) (map[model.RunStatus]int, error) {
	query, args := `SELECT status, COUNT(*) FROM runs GROUP BY status`, []any{}
	if userID != "" {
		query, args = s.q(`SELECT r.status, COUNT(*) FROM runs r JOIN tasks t ON t.id = r.task_id WHERE t.user_id = ? GROUP BY r.status`), []any{userID}
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: count runs: %w", s.d.Name, err)
	}
	defer rows.Close()
	out := map[model.RunStatus]int{}
	for rows.Next() {
		var (
			st string
			n  int
		)
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("%s: count runs: %w", s.d.Name, err)
		}
		out[model.RunStatus(st)] = n
	}
	return out, rows.Err()
}

// Ready implements controlplane.Store.
func (s *Store) Ready(ctx context.Context) error {
	var v sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		return fmt.Errorf("%s: not ready: %w", s.d.Name, err)
	}
	if int(v.Int64) < s.d.SchemaVersion {
		return fmt.Errorf("%s: not ready: schema version %d, want %d", s.d.Name, v.Int64, s.d.SchemaVersion)
	}
	return nil
}

// Close implements controlplane.Store.
func (s *Store) Close() error { return s.db.Close() }
