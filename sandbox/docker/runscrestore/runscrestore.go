// Package runscrestore is an OCI runtime in front of gVisor's runsc that
// lets the Docker engine restore a container from a runsc checkpoint.
//
// Registered with dockerd as a runtime of its own (see
// docs/checkpoints.md), it passes every call through to runsc unchanged,
// except for a container whose OCI spec holds the environment variable
// EnvRestoreImage=DIR: its `create` becomes `runsc restore --detach
// --image-path DIR`, which creates and starts the sandbox from the
// checkpoint, and its `start`, which finds it running already, does nothing.
//
// The variable is read from the bundle's config.json, which dockerd writes
// from the container's configuration; whoever may set it may already create
// containers on the engine. The restored processes keep the environment
// they were checkpointed with, so the variable never reaches them.
package runscrestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// EnvRestoreImage names the OCI process environment variable whose value is
// the checkpoint image directory a container is restored from.
const EnvRestoreImage = "TASKRUN_RESTORE_IMAGE"

// RunscFlag, given first among the runtime's arguments as RunscFlag=PATH,
// names the runsc binary; without it runsc is looked up on PATH.
const RunscFlag = "--taskrun-runsc"

// valueFlags are runsc's global flags that take their value as the next
// argument when not written flag=value (the ones containerd's shim passes).
var valueFlags = []string{"--root", "-root", "--log", "-log", "--log-format", "-log-format", "--debug-log", "-debug-log"}

// Call is one invocation of the runtime, split into its parts.
type Call struct {
	// Runsc is the runsc binary to run.
	Runsc string
	// Global are runsc's global flags, before the subcommand.
	Global []string
	// Command is the subcommand ("create", "start", "state"...), "" when none.
	Command string
	// Args are the subcommand's flags and arguments.
	Args []string
}

// Parse splits the runtime's arguments (without the program name).
func Parse(args []string) Call {
	c := Call{Runsc: "runsc"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if v, ok := strings.CutPrefix(a, RunscFlag+"="); ok {
			c.Runsc = v
			continue
		}
		if !strings.HasPrefix(a, "-") {
			c.Command, c.Args = a, args[i+1:]
			return c
		}
		c.Global = append(c.Global, a)
		if !strings.Contains(a, "=") && slices.Contains(valueFlags, a) && i+1 < len(args) {
			i++
			c.Global = append(c.Global, args[i])
		}
	}
	return c
}

// flagValue returns the value of flag name in args (as -name V, --name V,
// -name=V or --name=V) and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		for _, p := range []string{"-" + name, "--" + name} {
			if a == p && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

// ociSpec is the part of an OCI runtime spec the runtime reads.
type ociSpec struct {
	Process *struct {
		Env []string `json:"env"`
	} `json:"process"`
}

// RestoreImage returns the checkpoint image directory the bundle's
// config.json asks for, or "" when it asks for none.
func RestoreImage(bundle string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", fmt.Errorf("read OCI spec: %w", err)
	}
	var spec ociSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return "", fmt.Errorf("parse OCI spec %s: %w", filepath.Join(bundle, "config.json"), err)
	}
	if spec.Process == nil {
		return "", nil
	}
	for _, kv := range spec.Process.Env {
		if v, ok := strings.CutPrefix(kv, EnvRestoreImage+"="); ok {
			if !filepath.IsAbs(v) {
				return "", fmt.Errorf("%s=%q: the checkpoint image path must be absolute", EnvRestoreImage, v)
			}
			return filepath.Clean(v), nil
		}
	}
	return "", nil
}

// ErrNotRestoring says a call is not one the runtime rewrites.
var ErrNotRestoring = errors.New("not a restore")

// Rewrite returns the runsc arguments a create call becomes when its bundle
// asks for a restore: `restore --detach --image-path DIR` with the create's
// own flags and container ID. For any other call, or a bundle that asks for
// no restore, the error is ErrNotRestoring.
func Rewrite(c Call) ([]string, error) {
	if c.Command != "create" {
		return nil, ErrNotRestoring
	}
	bundle, ok := flagValue(c.Args, "bundle")
	if !ok {
		if bundle, ok = flagValue(c.Args, "b"); !ok {
			bundle = "."
		}
	}
	img, err := RestoreImage(bundle)
	if err != nil {
		return nil, err
	}
	if img == "" {
		return nil, ErrNotRestoring
	}
	if fi, err := os.Stat(img); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("checkpoint image %s is not a directory: %w", img, errors.Join(err, os.ErrNotExist))
	}
	argv := slices.Clone(c.Global)
	argv = append(argv, "restore", "--detach", "--image-path", img)
	return append(argv, createArgs(c.Args)...), nil
}

// createArgs drops the create flags restore does not know.
func createArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if a == "--no-pivot" || a == "-no-pivot" || a == "--no-new-keyring" || a == "-no-new-keyring" {
			continue
		}
		out = append(out, a)
	}
	return out
}
