// Command taskrun-probe is the in-sandbox self-check and entrypoint wrapper:
//
//	taskrun-probe --nonce N [--expect JSON] [--mode enforce|report] -- CMD ARGS...
//
// It observes the sandbox, writes one line "TASKRUN-PROBE N <base64 JSON>" to
// stderr, compares the observations with --expect and, in enforce mode (the
// default), exits 86 with the reasons on stderr if anything contradicts the
// expectation. Otherwise it replaces itself with CMD (looked up in PATH), so
// the agent starts only after the report is out. Without CMD it exits 0 after
// the report. Build it static: CGO_ENABLED=0 go build ./cmd/taskrun-probe.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/taskrun/taskrun/probe"
)

const exitUsage = 2

func main() {
	argv, code := run(context.Background(), os.Args[1:], os.Stderr)
	if argv == nil {
		os.Exit(code)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "taskrun-probe: command %q not found in PATH: %v\n", argv[0], err)
		os.Exit(127)
	}
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "taskrun-probe: exec %s: %v\n", path, err)
	os.Exit(126)
}

// run does everything but the exec: it returns the command to exec, or nil
// and the exit code.
func run(ctx context.Context, args []string, stderr io.Writer) ([]string, int) {
	fset := flag.NewFlagSet("taskrun-probe", flag.ContinueOnError)
	fset.SetOutput(stderr)
	nonce := fset.String("nonce", "", "per-run nonce echoed in the report line (required)")
	expect := fset.String("expect", "{}", "JSON probe.Expectation to enforce")
	mode := fset.String("mode", "enforce", `"enforce" refuses to run CMD on a contradiction; "report" only warns`)
	if err := fset.Parse(args); err != nil {
		return nil, exitUsage
	}
	if *nonce == "" || (*mode != "enforce" && *mode != "report") {
		fmt.Fprintln(stderr, "taskrun-probe: usage: taskrun-probe --nonce N [--expect JSON] [--mode enforce|report] -- CMD ARGS...")
		return nil, exitUsage
	}
	exp, err := probe.ParseExpectation([]byte(*expect))
	if err != nil {
		fmt.Fprintf(stderr, "taskrun-probe: --expect: %v\n", err)
		return nil, exitUsage
	}
	rep := probe.Collect(ctx, *nonce, probe.Config{})
	line, err := probe.FormatLine(rep)
	if err != nil {
		fmt.Fprintf(stderr, "taskrun-probe: %v\n", err)
		return nil, exitUsage
	}
	if _, err := stderr.Write(line); err != nil {
		return nil, probe.ExitContradiction
	}
	if bad := exp.Contradictions(rep); len(bad) > 0 {
		if err := reportContradictions(stderr, *mode, bad); err != nil {
			return nil, probe.ExitContradiction
		}
	}
	if fset.NArg() == 0 {
		return nil, 0
	}
	return fset.Args(), 0
}

var errRefused = errors.New("sandbox contradicts the expectation")

// reportContradictions prints the reasons; in enforce mode it returns
// errRefused so the command is never started.
func reportContradictions(stderr io.Writer, mode string, bad []string) error {
	verdict := "refusing to start the command"
	if mode == "report" {
		verdict = "starting anyway (--mode report)"
	}
	fmt.Fprintf(stderr, "taskrun-probe: %v, %s:\n", errRefused, verdict)
	for _, b := range bad {
		fmt.Fprintf(stderr, "taskrun-probe:   - %s\n", b)
	}
	if mode == "enforce" {
		return errRefused
	}
	return nil
}
