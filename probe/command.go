package probe

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// CommandProblem is why the command the self-check was to start cannot
// start as the container's uid. The self-check reports it in its report line
// and does not try to start the command.
type CommandProblem struct {
	// Command is the command as given (argv[0]); Path is where it was found.
	Command string `json:"command"`
	Path    string `json:"path,omitempty"`
	// Problem says what is wrong, Need what the image must provide.
	Problem string `json:"problem"`
	Need    string `json:"need"`
}

// The commands' exit statuses when the self-check cannot start it, as a
// shell's.
const (
	ExitCommandNotFound      = 127
	ExitCommandNotExecutable = 126
)

// What an image needs, named in CommandProblem.Need.
const (
	needExecutable = "the image's command must be a file readable and executable by any uid (mode 0755, in directories every uid can search): runs use a uid of their own, never root"
	needFound      = "the image's command must exist in the image, at an absolute path or in the image's PATH"
	needLoader     = "a dynamically linked command needs its loader and libraries in the image; use a static or self-contained binary"
)

// maxHeader bounds what is read of the command to tell a script or an ELF
// binary's loader.
const maxHeader = 1 << 20

// CheckCommand reports why argv cannot start as this process's uid (nil
// when nothing is in the way): not found, not executable (or, for a
// script, not readable), or a missing script interpreter or ELF loader.
// A command without a "/" is looked up in $PATH, as exec does.
func CheckCommand(argv []string) *CommandProblem {
	if len(argv) == 0 {
		return nil
	}
	name := argv[0]
	pathEnv := os.Getenv("PATH")
	path, err := lookPath(name, pathEnv)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return &CommandProblem{Command: name, Path: path, Problem: fmt.Sprintf("%s is not executable by uid %d%s", path, os.Getuid(), describeMode(path)), Need: needExecutable}
		}
		return &CommandProblem{Command: name, Problem: fmt.Sprintf("command %q not found (PATH=%s)", name, pathEnv), Need: needFound}
	}
	if err := syscall.Access(path, 0x1 /* X_OK */); err != nil {
		return &CommandProblem{Command: name, Path: path, Problem: fmt.Sprintf("%s is not executable by uid %d%s", path, os.Getuid(), describeMode(path)), Need: needExecutable}
	}
	f, err := os.Open(path)
	if err != nil {
		// An unreadable ELF binary still runs; a script does not, but
		// which it is cannot be told without reading it.
		return nil
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if interp, ok := bytes.CutPrefix(head, []byte("#!")); ok {
		line, _, _ := bytes.Cut(interp, []byte("\n"))
		fields := strings.Fields(string(line))
		if len(fields) == 0 {
			return nil
		}
		if p := interpreterProblem(fields[0]); p != "" {
			return &CommandProblem{Command: name, Path: path, Problem: fmt.Sprintf("the script's interpreter %s %s", fields[0], p), Need: needFound}
		}
		return nil
	}
	if e, err := elf.NewFile(io.NewSectionReader(f, 0, maxHeader)); err == nil {
		for _, prog := range e.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			b, err := io.ReadAll(io.LimitReader(prog.Open(), 4096))
			if err != nil {
				return nil
			}
			loader := string(bytes.TrimRight(b, "\x00"))
			if p := interpreterProblem(loader); p != "" {
				return &CommandProblem{Command: name, Path: path, Problem: fmt.Sprintf("%s is dynamically linked and its loader %s %s", path, loader, p), Need: needLoader}
			}
		}
	}
	return nil
}

// interpreterProblem says why path cannot be run as an interpreter, or "".
func interpreterProblem(path string) string {
	if _, err := os.Stat(path); err != nil {
		return "is missing from the image"
	}
	if err := syscall.Access(path, 0x1); err != nil {
		return fmt.Sprintf("is not executable by uid %d%s", os.Getuid(), describeMode(path))
	}
	return ""
}

// lookPath finds name as exec.LookPath does; for a command found but not
// executable it returns the path with the error.
func lookPath(name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		p, err := exec.LookPath(name)
		if err != nil && errors.Is(err, fs.ErrPermission) {
			return name, err
		}
		return p, err
	}
	p, err := exec.LookPath(name)
	if err != nil && errors.Is(err, fs.ErrPermission) {
		for _, dir := range strings.Split(pathEnv, ":") {
			if dir == "" {
				dir = "."
			}
			if c := dir + "/" + name; fileExists(c) {
				return c, err
			}
		}
	}
	return p, err
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// describeMode is " (mode 0700, owner 0:0)" for path, or "".
func describeMode(path string) string {
	info, err := os.Stat(path)
	if err != nil {
		return ""
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf(" (mode %#o, owner %d:%d)", info.Mode().Perm(), st.Uid, st.Gid)
	}
	return fmt.Sprintf(" (mode %#o)", info.Mode().Perm())
}
