package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// sessionFile is the session state kept in home across resumed runs.
const sessionFile = "session.json"

// sessionRun records one run of the session.
type sessionRun struct {
	RunID     string    `json:"run_id"`
	Mode      string    `json:"mode"`
	StartedAt time.Time `json:"started_at"`
}

// sessionState is what a resumed run finds from the runs before it.
type sessionState struct {
	SessionID string       `json:"session_id"`
	RunCount  int          `json:"run_count"`
	Runs      []sessionRun `json:"runs"`
}

// loadSession reads the session state from dir; a missing file is a new session.
func loadSession(dir string) (sessionState, error) {
	var s sessionState
	data, err := os.ReadFile(filepath.Join(dir, sessionFile))
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read session state: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("parse session state %s (delete it to start a new session): %w", filepath.Join(dir, sessionFile), err)
	}
	return s, nil
}

// recordRun appends this run to the session state and saves it in dir.
func recordRun(dir string, s sessionState, c agentConfig, mode string) (sessionState, error) {
	s.SessionID = c.SessionID
	s.RunCount++
	s.Runs = append(s.Runs, sessionRun{RunID: c.RunID, Mode: mode, StartedAt: time.Now().UTC()})
	return s, writeJSON(filepath.Join(dir, sessionFile), s)
}

// writeJSON writes v as indented JSON through a temporary file and a rename.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return writeFileAtomic(path, append(data, '\n'))
}

// writeFileAtomic creates path's directory and writes data through a rename.
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", filepath.Base(path), err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}
