// Package fencedstore makes every write of a leased run's objects carry the
// run's lease: a wrapped store confirms the lease with the control plane
// before each write, and drops the write once the run has ended or its lease
// moved on (to another worker, or to nobody). A worker whose lease is lost
// therefore stores nothing more for the run, and a recovered attempt never
// writes over a run that another attempt, or the control plane, ended.
//
// Reads are not fenced.
package fencedstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workerclient"
)

// Confirm confirms, before a write, that the caller still holds the run's
// lease. It answers nil when it does; an error wrapping
// workerclient.ErrLeaseLost or workerclient.ErrNotHolder when the run ended
// or the lease moved on; any other error when it cannot tell.
type Confirm func(ctx context.Context) error

// Lost reports whether err says the lease is gone for good: the control
// plane refused it as stale (412) or as not this worker's (403).
func Lost(err error) bool {
	return errors.Is(err, workerclient.ErrLeaseLost) || errors.Is(err, workerclient.ErrNotHolder)
}

// Store wraps a run's stores (persist.PersistStorage and
// persist.ArtifactStorage, and the run index when the wrapped store keeps
// one) with the run's lease. Before each write it calls
// Confirm:
//   - confirmed: the write goes through;
//   - the lease is lost: the write is dropped, and so is every later one.
//     The caller gets an empty ObjectInfo and no error, as a lost run's
//     reports are dropped: the run's fate is no longer this worker's, and
//     nothing must be kept to be retried. The reader is drained, so that
//     whatever feeds it is not left blocked;
//   - unknown (the control plane did not answer): the write fails with
//     that error, so the run is kept and retried, never stored unfenced.
type Store struct {
	persist   persist.PersistStorage
	artifacts persist.ArtifactStorage
	confirm   Confirm
	log       *slog.Logger
	lost      atomic.Bool
	dropped   atomic.Int64
}

// New wraps p and a (either may be nil) with confirm. log receives one line
// when the first write is dropped.
func New(p persist.PersistStorage, a persist.ArtifactStorage, confirm Confirm, log *slog.Logger) *Store {
	if log == nil {
		log = slog.Default()
	}
	return &Store{persist: p, artifacts: a, confirm: confirm, log: log}
}

var (
	_ persist.PersistStorage  = (*Store)(nil)
	_ persist.ArtifactStorage = (*Store)(nil)
)

// Dropped returns how many writes were dropped.
func (s *Store) Dropped() int64 { return s.dropped.Load() }

// allow confirms the lease before a write: true to write, false to drop.
func (s *Store) allow(ctx context.Context, what string, r io.Reader) (bool, error) {
	if !s.lost.Load() {
		err := s.confirm(ctx)
		switch {
		case err == nil:
			return true, nil
		case !Lost(err):
			return false, fmt.Errorf("confirm the run's lease before storing %s: %w", what, err)
		}
		if s.lost.CompareAndSwap(false, true) {
			s.log.Warn("the run's lease is lost: dropping its store writes", "object", what, "err", err)
		}
	}
	s.dropped.Add(1)
	if r != nil {
		_, _ = io.Copy(io.Discard, r)
	}
	return false, nil
}

// PutRunFile implements persist.PersistStorage.
func (s *Store) PutRunFile(ctx context.Context, ref persist.RunRef, name string, r io.Reader, contentType string) (persist.ObjectInfo, error) {
	if ok, err := s.allow(ctx, name, r); !ok {
		return persist.ObjectInfo{}, err
	}
	return s.persist.PutRunFile(ctx, ref, name, r, contentType)
}

// OpenRunFile implements persist.PersistStorage.
func (s *Store) OpenRunFile(ctx context.Context, ref persist.RunRef, name string) (io.ReadCloser, error) {
	return s.persist.OpenRunFile(ctx, ref, name)
}

// PutGlobalFile implements persist.PersistStorage.
func (s *Store) PutGlobalFile(ctx context.Context, userID, relPath string, r io.Reader, contentType string) (persist.ObjectInfo, error) {
	if ok, err := s.allow(ctx, relPath, r); !ok {
		return persist.ObjectInfo{}, err
	}
	return s.persist.PutGlobalFile(ctx, userID, relPath, r, contentType)
}

// OpenGlobalFile implements persist.PersistStorage.
func (s *Store) OpenGlobalFile(ctx context.Context, userID, relPath string) (io.ReadCloser, error) {
	return s.persist.OpenGlobalFile(ctx, userID, relPath)
}

// PutArtifact implements persist.ArtifactStorage.
func (s *Store) PutArtifact(ctx context.Context, ref persist.RunRef, relPath string, r io.Reader, contentType string) (persist.ObjectInfo, error) {
	if ok, err := s.allow(ctx, relPath, r); !ok {
		return persist.ObjectInfo{}, err
	}
	return s.artifacts.PutArtifact(ctx, ref, relPath, r, contentType)
}

// OpenArtifact implements persist.ArtifactStorage.
func (s *Store) OpenArtifact(ctx context.Context, ref persist.RunRef, relPath string) (io.ReadCloser, error) {
	return s.artifacts.OpenArtifact(ctx, ref, relPath)
}

// indexWriter is the run index's writer (runindex.Writer).
type indexWriter interface {
	PutIndex(ctx context.Context, ref persist.RunRef, start time.Time, doc []byte) (persist.ObjectInfo, error)
}

// ErrNoIndex is returned by PutIndex when the wrapped store keeps no run
// index.
var ErrNoIndex = errors.New("fencedstore: the wrapped store keeps no run index")

// PutIndex writes the run's index record through the wrapped store, as
// runindex.Writer does, fenced as every other write: a run's lister, the
// web interface and `taskrun runs` find a leased run as they find a local
// one.
func (s *Store) PutIndex(ctx context.Context, ref persist.RunRef, start time.Time, doc []byte) (persist.ObjectInfo, error) {
	w, ok := s.persist.(indexWriter)
	if !ok {
		return persist.ObjectInfo{}, ErrNoIndex
	}
	if ok, err := s.allow(ctx, "the run index", nil); !ok {
		return persist.ObjectInfo{}, err
	}
	return w.PutIndex(ctx, ref, start, doc)
}
