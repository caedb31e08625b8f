package webui

import (
	"context"
	"fmt"
	"sync"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/workerclient"
)

// Bounds of a Streams.
const (
	// DefaultStreamBytes is how much of each run's output a Streams keeps:
	// the newest bytes; a follower asking for older ones starts at the
	// oldest kept byte (the whole log is in the store once the run ends).
	DefaultStreamBytes = 4 << 20
	// DefaultStreams is how many runs' streams a Streams keeps; past it the
	// oldest ended stream is forgotten, and a new stream is refused when
	// none has ended.
	DefaultStreams = 1024
)

// Streams holds the live output of running runs, as the control plane
// receives it: it is a workerclient.StreamSender (give it to a run as its
// StreamSender, or feed it from the stream endpoint) applying the API's
// offset rules, and followers wait on it for new bytes. It is safe for
// concurrent use.
type Streams struct {
	mu       sync.Mutex
	maxBytes int
	maxRuns  int
	runs     map[string]*liveStream
	ended    []string // ended streams, oldest first
}

type liveStream struct {
	base  int64 // stream offset of buf[0]
	buf   []byte
	ended bool
	// wake is closed and replaced whenever bytes arrive or the stream ends.
	wake chan struct{}
}

var _ workerclient.StreamSender = (*Streams)(nil)

// NewStreams returns a Streams keeping at most maxBytes of each run's output
// and at most maxRuns streams (<= 0: the defaults).
func NewStreams(maxBytes, maxRuns int) *Streams {
	if maxBytes <= 0 {
		maxBytes = DefaultStreamBytes
	}
	if maxRuns <= 0 {
		maxRuns = DefaultStreams
	}
	return &Streams{maxBytes: maxBytes, maxRuns: maxRuns, runs: map[string]*liveStream{}}
}

// Send appends a delta of runID's output: bytes already held are dropped, a
// delta past the next expected offset is refused (workerclient.ErrStreamGap).
func (s *Streams) Send(_ context.Context, runID string, d workerclient.Delta) error {
	if err := model.ValidateID("run", runID); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ls, err := s.streamLocked(runID)
	if err != nil {
		return err
	}
	next := ls.base + int64(len(ls.buf))
	switch {
	case ls.ended && d.Offset+int64(len(d.Data)) > next:
		return fmt.Errorf("%w: run %s: bytes past the end of its stream", workerclient.ErrStreamGap, runID)
	case d.Offset > next:
		return fmt.Errorf("%w: run %s delta at offset %d, expected %d", workerclient.ErrStreamGap, runID, d.Offset, next)
	}
	skip := min(next-d.Offset, int64(len(d.Data)))
	if rest := d.Data[skip:]; len(rest) > 0 {
		ls.buf = append(ls.buf, rest...)
		if over := len(ls.buf) - s.maxBytes; over > 0 {
			ls.buf = append(ls.buf[:0:0], ls.buf[over:]...)
			ls.base += int64(over)
		}
		ls.wakeLocked()
	}
	return nil
}

// End marks runID's stream ended at total bytes.
func (s *Streams) End(_ context.Context, runID string, total int64) error {
	if err := model.ValidateID("run", runID); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ls, err := s.streamLocked(runID)
	if err != nil {
		return err
	}
	if next := ls.base + int64(len(ls.buf)); next != total {
		return fmt.Errorf("%w: run %s ended at %d bytes but %d were received", workerclient.ErrStreamGap, runID, total, next)
	}
	if !ls.ended {
		ls.ended = true
		s.ended = append(s.ended, runID)
		ls.wakeLocked()
	}
	return nil
}

// streamLocked returns runID's stream, creating it, and forgetting the
// oldest ended stream when there are too many.
func (s *Streams) streamLocked(runID string) (*liveStream, error) {
	if ls, ok := s.runs[runID]; ok {
		return ls, nil
	}
	if len(s.runs) >= s.maxRuns {
		if len(s.ended) == 0 {
			return nil, fmt.Errorf("webui: %d live streams and none ended: raise the stream limit", len(s.runs))
		}
		delete(s.runs, s.ended[0])
		s.ended = s.ended[1:]
	}
	ls := &liveStream{wake: make(chan struct{})}
	s.runs[runID] = ls
	return ls, nil
}

func (ls *liveStream) wakeLocked() {
	close(ls.wake)
	ls.wake = make(chan struct{})
}

// Has reports whether Streams holds a stream of runID.
func (s *Streams) Has(runID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.runs[runID]
	return ok
}

// Follow returns runID's output from offset on (from the oldest byte kept
// when offset is older), at most max bytes, waiting until there is some or
// the stream ended. ok is false when Streams holds no stream of runID.
func (s *Streams) Follow(ctx context.Context, runID string, offset int64, max int) (c Chunk, ok bool, err error) {
	for {
		s.mu.Lock()
		ls, found := s.runs[runID]
		if !found {
			s.mu.Unlock()
			return Chunk{}, false, nil
		}
		next := ls.base + int64(len(ls.buf))
		offset = max64(offset, ls.base)
		if offset < next || ls.ended {
			from := min(offset, next)
			data := ls.buf[from-ls.base:]
			if len(data) > max {
				data = data[:max]
			}
			c = Chunk{Offset: from, Data: append([]byte(nil), data...), Ended: ls.ended && from+int64(len(data)) == next}
			s.mu.Unlock()
			return c, true, nil
		}
		wake := ls.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Chunk{}, true, ctx.Err()
		}
	}
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
