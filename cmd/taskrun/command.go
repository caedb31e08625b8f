package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/moby/term"
	"github.com/spf13/pflag"
)

// command is one subcommand of taskrun. Each lives in its own file and adds
// itself with register from an init function; nothing else lists commands.
// A new command is one file:
//
//	func init() {
//		register(&command{
//			Name:     "logs",
//			Synopsis: "print a run's output log",
//			Args:     "RUN",
//			Flags: func(fs *pflag.FlagSet) action {
//				var store string
//				addStoreFlag(fs, &store) // shared flags come from flags.go
//				stderr := fs.Bool("stderr", false, "print the stderr log instead")
//				return func(ctx context.Context, a *app, args []string) int {
//					if len(args) != 1 {
//						return a.usageError("logs", errors.New("name one run"))
//					}
//					return runLogs(ctx, a, store, args[0], *stderr)
//				}
//			},
//		})
//	}
//
// Output goes to a.stdout and a.stderr, logs to a.log; anything the agent
// controls goes through termsafe before it reaches a terminal.
type command struct {
	// Name is the word after "taskrun".
	Name string
	// Synopsis is the one line `taskrun help` shows for the command.
	Synopsis string
	// Args is what follows "taskrun NAME [flags]" in the usage line, e.g.
	// "[--] [CMD ARGS...]"; empty when the command takes no arguments.
	Args string
	// Help is the longer description `taskrun help NAME` prints (optional).
	Help string
	// StopAtCommand ends flag parsing at the first argument that is not a
	// flag: it and everything after it are the command's arguments, flags
	// included (pflag's SetInterspersed(false)). Otherwise flags may come
	// before or after the arguments.
	StopAtCommand bool
	// Flags defines the command's flags on fs and returns the action that
	// runs once they are parsed.
	Flags func(fs *pflag.FlagSet) action
}

// action runs a command with its parsed flags and its arguments, and returns
// the process's exit status.
type action func(ctx context.Context, a *app, args []string) int

// commands is the table of subcommands, sorted by name.
var commands []*command

// register adds c to the table of commands.
func register(c *command) {
	if c.Name == "" || c.Synopsis == "" || c.Flags == nil {
		panic("taskrun: command needs a Name, a Synopsis and Flags")
	}
	if lookup(c.Name) != nil {
		panic("taskrun: command " + c.Name + " registered twice")
	}
	commands = append(commands, c)
	slices.SortFunc(commands, func(a, b *command) int { return strings.Compare(a.Name, b.Name) })
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// app is what every command shares: where output goes, the global flags and
// the logger built from them.
type app struct {
	stdout, stderr io.Writer
	// isTerminal reports whether w is a terminal (replaced in tests).
	isTerminal func(w io.Writer) bool

	quiet     bool
	logFormat logFormat
	log       *slog.Logger
}

func newApp(stdout, stderr io.Writer) *app {
	return &app{stdout: stdout, stderr: stderr, isTerminal: isTerminal, logFormat: logFormatText}
}

// isTerminal reports whether w is a file open on a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}

// dispatch runs taskrun with args (without the program name).
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return newApp(stdout, stderr).run(ctx, args)
}

// globalFlags are accepted before the command name and among its flags.
func (a *app) globalFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("global", pflag.ContinueOnError)
	fs.BoolVarP(&a.quiet, "quiet", "q", false, "print only warnings and errors: no status lines, no summary")
	fs.Var(&a.logFormat, "log-format", "format of taskrun's own log on stderr: text or json")
	return fs
}

// run parses the global flags and the command name, then runs the command.
func (a *app) run(ctx context.Context, args []string) int {
	globals := a.globalFlags()
	root := newFlagSet("taskrun", a.stderr)
	root.SetInterspersed(false)
	root.AddFlagSet(globals)
	help := addHelpFlag(root)
	if err := root.Parse(args); err != nil {
		return a.usageError("", err)
	}
	if *help {
		a.writeUsage(a.stdout, globals)
		return exitOK
	}
	if root.NArg() == 0 {
		a.writeUsage(a.stderr, globals)
		return exitUsage
	}
	name, rest := root.Arg(0), root.Args()[1:]
	cmd := lookup(name)
	if cmd == nil {
		fmt.Fprintf(a.stderr, "taskrun: unknown command %q\nRun 'taskrun help' for the list of commands.\n", name)
		return exitUsage
	}
	fs := newFlagSet("taskrun "+cmd.Name, a.stderr)
	fs.SetInterspersed(!cmd.StopAtCommand)
	act := cmd.Flags(fs)
	help = addHelpFlag(fs)
	own := fs.FlagUsages()
	fs.AddFlagSet(globals)
	if err := fs.Parse(rest); err != nil {
		return a.usageError(cmd.Name, err)
	}
	if *help {
		writeCommandHelp(a.stdout, cmd, own, globals)
		return exitOK
	}
	a.log = a.newLogger()
	return act(ctx, a, fs.Args())
}

// newFlagSet returns a flag set that reports errors to the caller instead of
// printing or exiting.
func newFlagSet(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	fs.SortFlags = true
	return fs
}

func addHelpFlag(fs *pflag.FlagSet) *bool {
	return fs.BoolP("help", "h", false, "print this help")
}

// usageError reports a command-line mistake and returns exitUsage.
func (a *app) usageError(cmd string, err error) int {
	if cmd == "" {
		fmt.Fprintf(a.stderr, "taskrun: %v\nRun 'taskrun help' for usage.\n", err)
	} else {
		fmt.Fprintf(a.stderr, "taskrun %s: %v\nRun 'taskrun help %s' for usage.\n", cmd, err, cmd)
	}
	return exitUsage
}

// newLogger builds taskrun's own logger on stderr from the global flags.
func (a *app) newLogger() *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if a.quiet {
		opts.Level = slog.LevelWarn
	}
	if a.logFormat == logFormatJSON {
		return slog.New(slog.NewJSONHandler(a.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(a.stderr, opts))
}

// logFormat is the value of --log-format.
type logFormat string

const (
	logFormatText logFormat = "text"
	logFormatJSON logFormat = "json"
)

func (f *logFormat) String() string {
	if *f == "" {
		return string(logFormatText)
	}
	return string(*f)
}

func (f *logFormat) Set(v string) error {
	switch logFormat(v) {
	case logFormatText, logFormatJSON:
		*f = logFormat(v)
		return nil
	}
	return fmt.Errorf("%q is not a log format: use text or json", v)
}

func (f *logFormat) Type() string { return "text|json" }

// writeUsage prints the list of commands and the global flags.
func (a *app) writeUsage(w io.Writer, globals *pflag.FlagSet) {
	fmt.Fprint(w, "taskrun runs AI agents on tasks in fresh, hardened containers.\n\n")
	fmt.Fprint(w, "Usage:\n  taskrun [global flags] COMMAND [flags] [ARGS...]\n\nCommands:\n")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.Name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, c.Name, c.Synopsis)
	}
	fmt.Fprintf(w, "\nGlobal flags (before or after COMMAND):\n%s", globals.FlagUsages())
	fmt.Fprint(w, "\nRun 'taskrun help COMMAND' (or 'taskrun COMMAND --help') for a command's flags.\n")
}

// writeCommandHelp prints one command's usage, description, flags (as
// FlagUsages renders them) and the global flags.
func writeCommandHelp(w io.Writer, c *command, flags string, globals *pflag.FlagSet) {
	usage := "taskrun " + c.Name + " [flags]"
	if c.Args != "" {
		usage += " " + c.Args
	}
	fmt.Fprintf(w, "Usage:\n  %s\n\n%s.\n", usage, upperFirst(c.Synopsis))
	if c.Help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.Help))
	}
	fmt.Fprintf(w, "\nFlags:\n%s\nGlobal flags:\n%s", flags, globals.FlagUsages())
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// errHelpTopic is returned for `taskrun help` with a name that is no command.
var errHelpTopic = errors.New("no such command")

func init() {
	register(&command{
		Name:     "help",
		Synopsis: "print the list of commands, or one command's usage and flags",
		Args:     "[COMMAND]",
		Flags: func(fs *pflag.FlagSet) action {
			return func(_ context.Context, a *app, args []string) int {
				switch len(args) {
				case 0:
					a.writeUsage(a.stdout, a.globalFlags())
					return exitOK
				case 1:
					c := lookup(args[0])
					if c == nil {
						return a.usageError("help", fmt.Errorf("%w: %q", errHelpTopic, args[0]))
					}
					cfs := newFlagSet("taskrun "+c.Name, a.stderr)
					c.Flags(cfs)
					addHelpFlag(cfs)
					writeCommandHelp(a.stdout, c, cfs.FlagUsages(), a.globalFlags())
					return exitOK
				}
				return a.usageError("help", errors.New("name one command"))
			}
		},
	})
}
