package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runindex"
	"github.com/taskrun/taskrun/sandbox/docker"
)

// Paths of the process API of a live run.
const (
	// PathProcesses: POST starts a command (an ExecRequest) in the
	// background and answers its ProcessInfo; GET lists the run's
	// commands.
	PathProcesses = "/v1/runs/{id}/processes"
	// PathProcess: GET is one command's ProcessInfo.
	PathProcess = "/v1/runs/{id}/processes/{pid}"
	// PathProcessOutput: GET streams a command's output from the offset
	// query parameter, as Frames, to its end (follow=false: what is there).
	PathProcessOutput = "/v1/runs/{id}/processes/{pid}/output"
	// PathProcessStdin: POST writes the body to a command's stdin
	// (close=true then closes it).
	PathProcessStdin = "/v1/runs/{id}/processes/{pid}/stdin"
	// PathProcessSignal: POST sends a SignalRequest's signal to a command.
	PathProcessSignal = "/v1/runs/{id}/processes/{pid}/signal"
)

// Bounds of the process API.
const (
	// MaxProcesses is how many commands a live run keeps: the oldest
	// ended one is forgotten for a new one, and a run with this many
	// running refuses another (429).
	MaxProcesses = 64
	// MaxProcessOutput is how much of a command's latest output the
	// daemon keeps for a reader that comes later: older output is dropped.
	MaxProcessOutput = 1 << 20
	// MaxStdinBytes bounds one write to a command's stdin.
	MaxStdinBytes = 1 << 20
)

// Signals is the allow-list of signals a client may send a command.
var Signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "WINCH": syscall.SIGWINCH,
}

// SignalRequest names a signal of Signals ("TERM" or "SIGTERM").
type SignalRequest struct {
	Signal string `json:"signal"`
}

// ProcessInfo describes a command of a live run.
type ProcessInfo struct {
	// ID names the command within its run.
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd"`
	// Stdin says the command's stdin is open for PathProcessStdin; Tty
	// that it runs on a PTY.
	Stdin     bool      `json:"stdin,omitempty"`
	Tty       bool      `json:"tty,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Running says the engine started the command and it has not ended:
	// it can be sent stdin and signals.
	Running bool `json:"running"`
	// Result is how it ended, once it has.
	Result *ExecResult `json:"result,omitempty"`
	// OutputBytes is the offset past its output so far, stdout and stderr
	// together; OutputFrom the first offset still kept.
	OutputBytes int64 `json:"output_bytes"`
	OutputFrom  int64 `json:"output_from"`
}

// chunk is a piece of a command's output at its offset.
type chunk struct {
	off    int64
	stderr bool
	data   []byte
}

// process is a command running, or run, in a live run.
type process struct {
	info ProcessInfo

	mu      sync.Mutex
	chunks  []chunk
	kept    int64
	end     int64
	changed chan struct{}
	execID  string
	result  *ExecResult
	done    chan struct{}

	stdinMu sync.Mutex
	stdin   *io.PipeWriter
}

// snapshot is the process's info now.
func (p *process) snapshot() ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := p.info
	info.Argv = append([]string(nil), info.Argv...)
	info.Running = p.execID != "" && p.result == nil // started, not ended
	info.Result = p.result
	info.OutputBytes, info.OutputFrom = p.end, p.end-p.kept
	return info
}

// add appends output, dropping the oldest beyond MaxProcessOutput.
func (p *process) add(stderr bool, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chunks = append(p.chunks, chunk{off: p.end, stderr: stderr, data: append([]byte(nil), b...)})
	p.end += int64(len(b))
	p.kept += int64(len(b))
	for p.kept > MaxProcessOutput && len(p.chunks) > 1 {
		p.kept -= int64(len(p.chunks[0].data))
		p.chunks = p.chunks[1:]
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// since is the kept output from offset on, the offset past it, whether
// the command has ended, and a channel closed at the next change.
func (p *process) since(offset int64) ([]chunk, int64, *ExecResult, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []chunk
	for _, c := range p.chunks {
		if end := c.off + int64(len(c.data)); end <= offset {
			continue
		}
		if c.off < offset {
			c = chunk{off: offset, stderr: c.stderr, data: c.data[offset-c.off:]}
		}
		out = append(out, c)
	}
	return out, p.end, p.result, p.changed
}

// processWriter is one of a command's streams into its output.
type processWriter struct {
	p      *process
	stderr bool
}

func (w processWriter) Write(b []byte) (int, error) {
	w.p.add(w.stderr, b)
	return len(b), nil
}

// processOf is the request's command of the peer's live run: 404 when
// either is not there.
func (s *Server) processOf(w http.ResponseWriter, r *http.Request) (*liveRun, *process, bool) {
	run, _, ok := s.liveOf(w, r)
	if !ok {
		return nil, nil, false
	}
	pid := r.PathValue("pid")
	run.procMu.Lock()
	p := run.procs[pid]
	run.procMu.Unlock()
	if p == nil {
		refuse(w, http.StatusNotFound, fmt.Errorf("run %s: no process %q", run.ref.RunID, pid))
		return nil, nil, false
	}
	return run, p, true
}

// startProcess starts req in run as the run's own user under its
// container's policy, as taskrun exec does; the command lives until it
// ends or the run does, and is recorded in the run's records once ended.
func (s *Server) startProcess(ctx context.Context, run *liveRun, peer Peer, req ExecRequest) (*process, int, error) {
	if len(req.Argv) == 0 {
		return nil, http.StatusBadRequest, errors.New("exec request: no argv")
	}
	dir := model.ContainerHomeDir
	if req.Cwd != "" {
		dir = path.Join(model.ContainerHomeDir, req.Cwd)
		if path.IsAbs(req.Cwd) {
			dir = path.Clean(req.Cwd)
		}
	}
	eng, status, err := s.engineOf(ctx, run)
	if err != nil {
		return nil, status, err
	}
	p := &process{info: ProcessInfo{Argv: append([]string(nil), req.Argv...), Cwd: dir, Stdin: req.Stdin, Tty: req.Tty,
		StartedAt: time.Now().UTC()}, changed: make(chan struct{}), done: make(chan struct{})}
	var stdin io.Reader
	if req.Stdin {
		pr, pw := io.Pipe()
		stdin, p.stdin = pr, pw
	}
	run.procMu.Lock()
	if len(run.procs) >= MaxProcesses {
		if !run.forgetEnded() {
			run.procMu.Unlock()
			return nil, http.StatusTooManyRequests, fmt.Errorf("run %s runs %d commands: no more until one ends", run.ref.RunID, MaxProcesses)
		}
	}
	run.nextProc++
	p.info.ID = "p" + strconv.Itoa(run.nextProc)
	run.procs[p.info.ID] = p
	run.order = append(run.order, p.info.ID)
	run.procMu.Unlock()

	caller := callerFrom(ctx)
	started := make(chan struct{})
	// The daemon's stop waits for the command's record.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		exit, err := docker.Exec(run.ctx, eng.cli, eng.id, docker.ExecOptions{User: eng.user, Cmd: req.Argv, Env: req.Env, Dir: dir,
			Tty: req.Tty, Stdin: stdin, Stdout: processWriter{p, false}, Stderr: processWriter{p, true},
			Started: func(execID string) {
				p.mu.Lock()
				p.execID = execID
				p.mu.Unlock()
				close(started)
			}})
		res := &ExecResult{Exit: exit}
		if err != nil {
			res.Error, res.Exit = err.Error(), -1
		}
		if p.stdin != nil {
			_ = p.stdin.CloseWithError(ErrProcessEnded)
		}
		run.touch()
		rec := &runindex.Record{RunID: run.ref.RunID, UserID: run.ref.UserID, ConversationID: run.ref.ConversationID, TaskID: run.ref.TaskID}
		by := "uid " + strconv.FormatUint(uint64(peer.UID), 10) + " through the taskrun daemon"
		if caller != "" {
			by = caller
		}
		if _, perr := runindex.PutExec(context.WithoutCancel(run.ctx), s.cfg.Host.Store(), rec,
			runindex.Exec{By: by, At: p.info.StartedAt, Command: req.Argv, Exit: res.Exit}); perr != nil {
			s.log.Warn("record a live run's command", "run", run.ref.RunID, "err", perr)
		}
		p.mu.Lock()
		p.result = res
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
		close(p.done)
	}()
	// Answer once the command runs (or could not), so a signal or stdin
	// that follows finds it.
	select {
	case <-started:
	case <-p.done:
	case <-ctx.Done():
	}
	return p, 0, nil
}

// ErrProcessEnded is stdin sent to a command that ended.
var ErrProcessEnded = errors.New("the command has ended")

// forgetEnded drops the oldest ended command; false when all run. Its
// caller holds procMu.
func (r *liveRun) forgetEnded() bool {
	for i, id := range r.order {
		p := r.procs[id]
		select {
		case <-p.done:
		default:
			continue
		}
		delete(r.procs, id)
		r.order = append(r.order[:i:i], r.order[i+1:]...)
		return true
	}
	return false
}

// startRequested starts the ExecRequest in r's body in run (startProcess),
// refusing a request it cannot read or start.
func (s *Server) startRequested(w http.ResponseWriter, r *http.Request, run *liveRun, peer Peer) (*process, bool) {
	var req ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxExecRequest)).Decode(&req); err != nil {
		refuse(w, http.StatusBadRequest, fmt.Errorf("exec request: %w", err))
		return nil, false
	}
	p, status, err := s.startProcess(r.Context(), run, peer, req)
	if err != nil {
		refuse(w, status, err)
		return nil, false
	}
	return p, true
}

// serveExec runs a command in the peer's live run and streams its output
// to its end: the first Frame names its process, so another call may send
// it stdin or a signal, and a client that goes away may reattach to it.
func (s *Server) serveExec(w http.ResponseWriter, r *http.Request) {
	run, peer, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	p, ok := s.startRequested(w, r, run, peer)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
	fw.write(Frame{Process: p.info.ID})
	s.follow(r.Context(), fw, p, 0, true)
}

// follow writes p's output from offset as frames, then its result once
// it ended; with follow it waits for more until then.
func (s *Server) follow(ctx context.Context, fw *frameWriter, p *process, offset int64, follow bool) {
	for {
		chunks, end, res, changed := p.since(offset)
		for _, c := range chunks {
			fr := Frame{Stdout: c.data, Offset: c.off}
			if c.stderr {
				fr = Frame{Stderr: c.data, Offset: c.off}
			}
			fw.write(fr)
		}
		offset = max(offset, end)
		if res != nil {
			fw.write(Frame{Exec: res})
			return
		}
		if !follow {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// serveProcesses starts a command in the background (POST) or lists the
// run's commands (GET).
func (s *Server) serveProcesses(w http.ResponseWriter, r *http.Request) {
	run, peer, ok := s.liveOf(w, r)
	if !ok {
		return
	}
	if r.Method == http.MethodGet {
		run.procMu.Lock()
		list := make([]*process, 0, len(run.order))
		for _, id := range run.order {
			list = append(list, run.procs[id])
		}
		run.procMu.Unlock()
		infos := make([]ProcessInfo, 0, len(list))
		for _, p := range list {
			infos = append(infos, p.snapshot())
		}
		answerJSON(w, http.StatusOK, infos)
		return
	}
	// The command outlives this request: it is the run's.
	p, ok := s.startRequested(w, r, run, peer)
	if !ok {
		return
	}
	answerJSON(w, http.StatusCreated, p.snapshot())
}

// serveProcess answers one command's ProcessInfo.
func (s *Server) serveProcess(w http.ResponseWriter, r *http.Request) {
	_, p, ok := s.processOf(w, r)
	if !ok {
		return
	}
	answerJSON(w, http.StatusOK, p.snapshot())
}

// serveProcessOutput streams a command's output from ?offset= (0: its
// start; output older than what is kept is skipped: see the frames'
// offsets), to its end, or what is there with follow=false.
func (s *Server) serveProcessOutput(w http.ResponseWriter, r *http.Request) {
	_, p, ok := s.processOf(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			refuse(w, http.StatusBadRequest, fmt.Errorf("offset %q: not a byte offset", v))
			return
		}
		offset = n
	}
	follow := q.Get("follow") != "false" && q.Get("follow") != "0"
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
	fw.flush()
	s.follow(r.Context(), fw, p, offset, follow)
}

// serveProcessStdin writes the body, at most MaxStdinBytes, to a
// command's stdin; close=true closes it after.
func (s *Server) serveProcessStdin(w http.ResponseWriter, r *http.Request) {
	run, p, ok := s.processOf(w, r)
	if !ok {
		return
	}
	if p.stdin == nil {
		refuse(w, http.StatusConflict, fmt.Errorf("process %s was started without stdin", p.info.ID))
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxStdinBytes+1))
	if err != nil {
		refuse(w, http.StatusBadRequest, fmt.Errorf("stdin: %w", err))
		return
	}
	if len(data) > MaxStdinBytes {
		refuse(w, http.StatusRequestEntityTooLarge, fmt.Errorf("stdin: over %d bytes in one call", MaxStdinBytes))
		return
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if len(data) > 0 {
		if _, err := p.stdin.Write(data); err != nil {
			refuse(w, http.StatusConflict, fmt.Errorf("process %s: stdin: %w", p.info.ID, err))
			return
		}
	}
	if c := r.URL.Query().Get("close"); c == "true" || c == "1" {
		_ = p.stdin.Close()
	}
	run.touch()
	w.WriteHeader(http.StatusNoContent)
}

// serveProcessSignal sends a signal of the allow-list to a command of the
// run, and to that process only.
func (s *Server) serveProcessSignal(w http.ResponseWriter, r *http.Request) {
	run, p, ok := s.processOf(w, r)
	if !ok {
		return
	}
	var req SignalRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil {
		refuse(w, http.StatusBadRequest, fmt.Errorf("signal request: %w", err))
		return
	}
	sig, ok := Signals[strings.TrimPrefix(strings.ToUpper(req.Signal), "SIG")]
	if !ok {
		refuse(w, http.StatusBadRequest, fmt.Errorf("signal %q: not one a client may send", req.Signal))
		return
	}
	p.mu.Lock()
	execID, ended := p.execID, p.result != nil
	p.mu.Unlock()
	if ended || execID == "" {
		refuse(w, http.StatusConflict, fmt.Errorf("process %s: %w", p.info.ID, docker.ErrExecNotRunning))
		return
	}
	eng, status, err := s.engineOf(r.Context(), run)
	if err != nil {
		refuse(w, status, err)
		return
	}
	if err := docker.SignalExec(r.Context(), eng.cli, eng.id, execID, sig); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, docker.ErrExecNotRunning) {
			status = http.StatusConflict
		}
		refuse(w, status, fmt.Errorf("process %s: %w", p.info.ID, err))
		return
	}
	s.log.Info("signal sent to a live run's command", "run", run.ref.RunID, "process", p.info.ID, "signal", sig)
	w.WriteHeader(http.StatusNoContent)
}

// answerJSON answers v as JSON with status.
func answerJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
