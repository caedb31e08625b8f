package runscrestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"syscall"
)

// Main runs the runtime with args (without the program name) and returns
// its exit status. A call it does not rewrite replaces the process with
// runsc, so runsc gets the caller's file descriptors and signals as if it
// had been called directly.
func Main(args []string, stderr io.Writer) int {
	c := Parse(args)
	runsc, err := exec.LookPath(c.Runsc)
	if err != nil {
		fmt.Fprintf(stderr, "taskrun-runsc-restore: runsc: %v\n", err)
		return 127
	}
	argv, err := Rewrite(c)
	switch {
	case errors.Is(err, ErrNotRestoring):
		if c.Command == "start" && restored(runsc, c) {
			// restore --detach started it already.
			return 0
		}
		argv = append(slices.Clone(c.Global), passArgs(c)...)
	case err != nil:
		fmt.Fprintf(stderr, "taskrun-runsc-restore: %v\n", err)
		return 1
	}
	err = syscall.Exec(runsc, append([]string{runsc}, argv...), os.Environ())
	fmt.Fprintf(stderr, "taskrun-runsc-restore: exec %s: %v\n", runsc, err)
	return 126
}

// passArgs are the subcommand and its arguments, unchanged.
func passArgs(c Call) []string {
	if c.Command == "" {
		return nil
	}
	return append([]string{c.Command}, c.Args...)
}

// restored reports whether the container a start call names is running
// already, as one a restore created is.
func restored(runsc string, c Call) bool {
	if len(c.Args) == 0 {
		return false
	}
	id := c.Args[len(c.Args)-1]
	out, err := exec.Command(runsc, append(slices.Clone(c.Global), "state", id)...).Output()
	if err != nil {
		return false
	}
	var st struct {
		Status string `json:"status"`
	}
	return json.Unmarshal(out, &st) == nil && st.Status == "running"
}
