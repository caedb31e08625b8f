package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Limits on what one tool call reads or returns.
const (
	maxReadBytes   = 256 << 10
	maxOutputBytes = 64 << 10
)

// errOutsideWorkspace is returned for paths outside the dirs a tool may use.
var errOutsideWorkspace = errors.New("path is outside the workspace")

// Canonical in-container paths the model is told about. They always map to
// the configured directories, wherever those are.
const (
	homePath      = "/taskrun/home"
	artifactsPath = "/taskrun/artifacts"
	outputPath    = "/taskrun/output"
)

// toolRoot is a directory tools may use, opened as an os.Root so that
// neither ".." nor symlinks can lead out of it.
type toolRoot struct {
	names []string
	root  *os.Root
}

// toolbox runs the agent's tools, confined to home (reads and writes) and
// to artifacts and output.
type toolbox struct {
	roots   []toolRoot
	home    string
	shell   string
	timeout time.Duration
}

// newToolbox opens the tool roots; run_command is offered only when the
// configured shell is an executable file.
func newToolbox(c agentConfig) (*toolbox, error) {
	t := &toolbox{home: c.Home, timeout: c.CommandTimeout}
	dirs := []struct{ canonical, real string }{
		{homePath, c.Home}, {artifactsPath, c.Artifacts}, {outputPath, c.Output},
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d.real, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", d.canonical, err)
		}
		r, err := os.OpenRoot(d.real)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", d.canonical, err)
		}
		abs, _ := filepath.Abs(d.real)
		t.roots = append(t.roots, toolRoot{names: []string{d.canonical, abs}, root: r})
	}
	if fi, err := os.Stat(c.Shell); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		t.shell = c.Shell
	}
	return t, nil
}

// Close releases the roots.
func (t *toolbox) Close() {
	for _, r := range t.roots {
		r.root.Close()
	}
}

// resolve maps a tool path to a root and a local name inside it. Relative
// paths are relative to home.
func (t *toolbox) resolve(p string) (*os.Root, string, error) {
	if p == "" {
		return nil, "", fmt.Errorf("%w: path is empty", errOutsideWorkspace)
	}
	if !strings.HasPrefix(p, "/") {
		return t.local(t.roots[0].root, p)
	}
	clean := path.Clean(p)
	for _, r := range t.roots {
		for _, name := range r.names {
			if clean == name {
				return r.root, ".", nil
			}
			if rest, ok := strings.CutPrefix(clean, name+"/"); ok {
				return t.local(r.root, rest)
			}
		}
	}
	return nil, "", fmt.Errorf("%w: %s: use a path under %s, %s or %s", errOutsideWorkspace, p, homePath, artifactsPath, outputPath)
}

func (t *toolbox) local(r *os.Root, name string) (*os.Root, string, error) {
	if !filepath.IsLocal(name) && path.Clean(name) != "." {
		return nil, "", fmt.Errorf("%w: %s leaves its directory", errOutsideWorkspace, name)
	}
	return r, filepath.Clean(name), nil
}

// toolSpec is a tool offered to the model (OpenAI function tool format).
type toolSpec struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Parameters  map[string]any `json:"parameters"`
}

func objectSchema(required []string, props map[string]any) map[string]any {
	return map[string]any{"type": "object", "properties": props, "required": required}
}

func stringProp(desc string) map[string]any {
	return map[string]any{"type": "string", "description": desc}
}

// specs lists the tools offered to the model.
func (t *toolbox) specs() []toolSpec {
	pathDesc := "relative to " + homePath + ", or absolute under " + homePath + ", " + artifactsPath + " or " + outputPath
	specs := []toolSpec{
		{"function", toolFunction{"list_dir", "List a directory's entries.", objectSchema([]string{"path"}, map[string]any{"path": stringProp(pathDesc)})}},
		{"function", toolFunction{"read_file", "Read a text file.", objectSchema([]string{"path"}, map[string]any{"path": stringProp(pathDesc)})}},
		{"function", toolFunction{"write_file", "Create or replace a file; parent directories are created.", objectSchema([]string{"path", "content"}, map[string]any{"path": stringProp(pathDesc), "content": stringProp("the whole new content")})}},
	}
	if t.shell != "" {
		specs = append(specs, toolSpec{"function", toolFunction{"run_command", "Run a shell command in " + homePath + " with a timeout; returns exit code and output.", objectSchema([]string{"command"}, map[string]any{"command": stringProp("shell command line")})}})
	}
	return specs
}

// toolArgs are the arguments any tool takes.
type toolArgs struct {
	Path    string  `json:"path"`
	Content *string `json:"content"`
	Command string  `json:"command"`
}

// call runs one tool and returns its result for the model. Errors are
// results too: the model sees them and can recover.
func (t *toolbox) call(ctx context.Context, name, rawArgs string) (string, error) {
	var a toolArgs
	if err := json.Unmarshal([]byte(rawArgs), &a); err != nil {
		return "", fmt.Errorf("arguments of %s are not a JSON object: %w", name, err)
	}
	switch name {
	case "list_dir":
		return t.listDir(a.Path)
	case "read_file":
		return t.readFile(a.Path)
	case "write_file":
		if a.Content == nil {
			return "", errors.New("write_file needs content")
		}
		return t.writeFile(a.Path, *a.Content)
	case "run_command":
		if t.shell != "" {
			return t.runCommand(ctx, a.Command)
		}
	}
	return "", fmt.Errorf("unknown tool %q", name)
}

func (t *toolbox) listDir(p string) (string, error) {
	r, name, err := t.resolve(p)
	if err != nil {
		return "", err
	}
	f, err := r.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return "", err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var b strings.Builder
	for _, e := range entries {
		switch info, err := e.Info(); {
		case e.IsDir():
			fmt.Fprintf(&b, "%s/\n", e.Name())
		case err == nil && info.Mode().IsRegular():
			fmt.Fprintf(&b, "%s (%d bytes)\n", e.Name(), info.Size())
		default:
			fmt.Fprintf(&b, "%s (%s)\n", e.Name(), e.Type())
		}
	}
	if b.Len() == 0 {
		return "(empty directory)", nil
	}
	return b.String(), nil
}

func (t *toolbox) readFile(p string) (string, error) {
	r, name, err := t.resolve(p)
	if err != nil {
		return "", err
	}
	f, err := r.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxReadBytes+1))
	if err != nil {
		return "", err
	}
	if len(data) > maxReadBytes {
		return string(data[:maxReadBytes]) + fmt.Sprintf("\n[truncated at %d bytes]", maxReadBytes), nil
	}
	return string(data), nil
}

func (t *toolbox) writeFile(p, content string) (string, error) {
	r, name, err := t.resolve(p)
	if err != nil {
		return "", err
	}
	if dir := filepath.Dir(name); dir != "." {
		if err := r.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	if err := r.WriteFile(name, []byte(content), 0o644); err != nil {
		return "", err
	}
	return fmt.Sprintf("wrote %d bytes to %s", len(content), p), nil
}

// runCommand runs a command line in home; on timeout the whole process
// group is killed.
func (t *toolbox) runCommand(ctx context.Context, command string) (string, error) {
	if strings.TrimSpace(command) == "" {
		return "", errors.New("run_command needs a command")
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, t.shell, "-c", command)
	cmd.Dir = t.home
	var out cappedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Sprintf("timed out after %s\n%s", t.timeout, out.String()), nil
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return "", err
	}
	return fmt.Sprintf("exit code %d\n%s", cmd.ProcessState.ExitCode(), out.String()), nil
}

// cappedBuffer keeps the first maxOutputBytes written to it.
type cappedBuffer struct {
	buf       bytes.Buffer
	truncated bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := maxOutputBytes - c.buf.Len(); room < len(p) {
		c.truncated = true
		c.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *cappedBuffer) String() string {
	if c.truncated {
		return c.buf.String() + "\n[output truncated]"
	}
	return c.buf.String()
}
