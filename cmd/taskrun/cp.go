package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/termsafe"
)

const cpHelp = `
Copies one file of a run out of the store. PATH is relative to the run:
artifacts/PATH (a delivered file), output/result.md (the final answer),
home/PATH (a file of the run's final home, read from its session state), or
another object of the run such as changes.json or audit.json. DEST is a file,
an existing directory (the file keeps its name) or - for stdout. --json prints
{"run_id", "path", "dest", "bytes", "sha256"} on stdout.
`

func init() {
	register(&command{
		Name:     "cp",
		Synopsis: "copy an artifact, output file or home file of a run out of the store",
		Args:     "RUN:PATH DEST",
		Help:     cpHelp + runLookupHelp + serverReadHelp + daemonReadHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var (
				run     readRunFlags
				jsonOut bool
			)
			run.define(fs)
			fs.BoolVar(&jsonOut, "json", false, "print what was copied as JSON")
			return func(ctx context.Context, a *app, args []string) int {
				if len(args) != 2 {
					return a.usageError("cp", errors.New("name a source and a destination: taskrun cp RUN:PATH DEST"))
				}
				runID, rel, ok := strings.Cut(args[0], ":")
				if !ok || rel == "" {
					return a.usageError("cp", fmt.Errorf("%q is not RUN:PATH: e.g. RUN:artifacts/report.md or RUN:home/main.go", args[0]))
				}
				if jsonOut && args[1] == "-" {
					return a.usageError("cp", errors.New("--json prints to stdout: give DEST as a file or directory"))
				}
				rr, code := run.open(ctx, a, "cp", runID)
				if rr == nil {
					return code
				}
				defer rr.Close()
				rec := rr.rec
				rc, err := rr.openFile(ctx, rel)
				if err != nil {
					return a.readError("cp", err)
				}
				defer rc.Close()
				res, err := copyOut(rc, args[1], path.Base(rel), a.stdout)
				if err != nil {
					fmt.Fprintln(a.stderr, "taskrun cp:", termsafe.String(err.Error()))
					return exitFailure
				}
				res.RunID, res.Path = rec.RunID, rel
				if jsonOut {
					if err := json.NewEncoder(a.stdout).Encode(res); err != nil {
						return exitFailure
					}
				}
				return exitOK
			}
		},
	})
}

// cpResult is what `taskrun cp --json` prints.
type cpResult struct {
	RunID  string `json:"run_id"`
	Path   string `json:"path"`
	Dest   string `json:"dest"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// copyOut writes r to dest ("-" is stdout; an existing directory gets a
// file called name), through a temporary file renamed into place.
func copyOut(r io.Reader, dest, name string, stdout io.Writer) (cpResult, error) {
	h := sha256.New()
	if dest == "-" {
		n, err := io.Copy(io.MultiWriter(stdout, h), r)
		return cpResult{Dest: dest, Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, err
	}
	if info, err := os.Stat(dest); err == nil && info.IsDir() {
		dest = filepath.Join(dest, name)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".taskrun-cp-*")
	if err != nil {
		return cpResult{}, err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(io.MultiWriter(tmp, h), r)
	if err := errors.Join(err, tmp.Chmod(0o644), tmp.Close()); err != nil {
		return cpResult{}, err
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return cpResult{}, err
	}
	return cpResult{Dest: dest, Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
