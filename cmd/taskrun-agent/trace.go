package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// tracer appends one JSON event per line to the run's trace file.
type tracer struct {
	mu  sync.Mutex
	w   io.WriteCloser
	err error
}

// traceEvent is one line of the trace.
type traceEvent struct {
	Time  time.Time      `json:"ts"`
	Event string         `json:"event"`
	Data  map[string]any `json:"data,omitempty"`
}

// openTracer creates (or appends to) the trace file at path.
func openTracer(path string) (*tracer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create trace directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	return &tracer{w: f}, nil
}

// Event writes one event. The first write error is kept and returned by Close;
// a broken trace never stops the agent.
func (t *tracer) Event(name string, data map[string]any) {
	line, err := json.Marshal(traceEvent{Time: time.Now().UTC(), Event: name, Data: data})
	if err != nil {
		line, _ = json.Marshal(traceEvent{Time: time.Now().UTC(), Event: name, Data: map[string]any{"marshal_error": err.Error()}})
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return
	}
	if _, err := t.w.Write(append(line, '\n')); err != nil {
		t.err = fmt.Errorf("write trace: %w", err)
	}
}

// Close closes the trace file and reports the first write error.
func (t *tracer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.w.Close(); err != nil && t.err == nil {
		t.err = fmt.Errorf("close trace: %w", err)
	}
	return t.err
}
