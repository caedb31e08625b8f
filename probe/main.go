package probe

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
)

// exitUsage is the self-check's exit status for invalid arguments.
const exitUsage = 2

// Main is the self-check as a program, run as taskrun-probe inside the
// sandbox (the taskrun binary runs it when invoked by that name, see package
// helpers; cmd/taskrun-probe builds it alone):
//
//	taskrun-probe --nonce N [--expect JSON] [--mode enforce|report] [--hold SOCKET] -- CMD ARGS...
//
// It observes the sandbox, writes one line "TASKRUN-PROBE N <base64 JSON>" to
// stderr, compares the observations with --expect and, in enforce mode (the
// default), exits 86 with the reasons on stderr if anything contradicts the
// expectation. With --hold it then waits for the host's go-ahead (see
// AwaitGoAhead) and exits 86 without one. Otherwise it replaces the process
// with CMD (looked up in PATH), so the agent starts only after the report is
// out, and does not return. Without CMD it returns 0 after the report. args
// are the arguments after the program name.
//
// Run as "taskrun-probe --gate SOCKET" it is the gate of a container
// parked ahead of its run (see GateFlag).
func Main(args []string) int {
	if len(args) == 2 && args[0] == GateFlag {
		return gateMain(args[1])
	}
	return mainWith(args, Config{})
}

// mainWith is Main with cfg for Collect.
func mainWith(args []string, cfg Config) int {
	argv, code := runMain(context.Background(), args, os.Stderr, cfg)
	if argv == nil {
		return code
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "taskrun-probe: command %q not found in PATH: %v; %s\n", argv[0], err, needFound)
		return ExitCommandNotFound
	}
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "taskrun-probe: exec %s: %v; %s\n", path, err, needExecutable)
	return ExitCommandNotExecutable
}

// runMain does everything but the exec: it returns the command to exec, or
// nil and the exit code.
func runMain(ctx context.Context, args []string, stderr io.Writer, cfg Config) ([]string, int) {
	fset := flag.NewFlagSet("taskrun-probe", flag.ContinueOnError)
	fset.SetOutput(stderr)
	nonce := fset.String("nonce", "", "per-run nonce echoed in the report line (required)")
	expect := fset.String("expect", "{}", "JSON probe.Expectation to enforce")
	mode := fset.String("mode", "enforce", `"enforce" refuses to run CMD on a contradiction; "report" only warns`)
	hold := fset.String(HoldFlag[2:], "", "unix socket of the host's hold: CMD starts only after the host's go-ahead on it")
	if err := fset.Parse(args); err != nil {
		return nil, exitUsage
	}
	if *nonce == "" || (*mode != "enforce" && *mode != "report") {
		fmt.Fprintln(stderr, "taskrun-probe: usage: taskrun-probe --nonce N [--expect JSON] [--mode enforce|report] [--hold SOCKET] -- CMD ARGS...")
		return nil, exitUsage
	}
	exp, err := ParseExpectation([]byte(*expect))
	if err != nil {
		fmt.Fprintf(stderr, "taskrun-probe: --expect: %v\n", err)
		return nil, exitUsage
	}
	cfg.SkipEgress = cfg.SkipEgress || exp.SkipEgressProbes
	cfg.Reach = exp.Unreachable
	rep := Collect(ctx, *nonce, cfg)
	rep.Command = CheckCommand(fset.Args())
	line, err := FormatLine(rep)
	if err != nil {
		fmt.Fprintf(stderr, "taskrun-probe: %v\n", err)
		return nil, exitUsage
	}
	if _, err := stderr.Write(line); err != nil {
		return nil, ExitContradiction
	}
	if bad := exp.Contradictions(rep); len(bad) > 0 {
		if err := reportContradictions(stderr, *mode, bad); err != nil {
			return nil, ExitContradiction
		}
	}
	if fset.NArg() == 0 {
		return nil, 0
	}
	if c := rep.Command; c != nil {
		fmt.Fprintf(stderr, "taskrun-probe: cannot start %s: %s; %s\n", c.Command, c.Problem, c.Need)
		if c.Path == "" {
			return nil, ExitCommandNotFound
		}
		return nil, ExitCommandNotExecutable
	}
	if *hold != "" {
		if err := AwaitGoAhead(ctx, *hold, *nonce, HoldTimeout); err != nil {
			fmt.Fprintf(stderr, "taskrun-probe: %v; refusing to start the command\n", err)
			return nil, ExitContradiction
		}
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
