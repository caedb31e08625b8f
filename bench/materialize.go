package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/workspace"
)

// materialize copies a workspace of many small files into a run home with
// workspace.CopyTree, as RunTask does (owner set to the sandbox user), and
// with `cp -a`, alternating rounds.
func materialize(ctx context.Context, e *env) ([]row, error) {
	src := filepath.Join(e.dir, "workspace")
	if err := makeTree(src, e.c.files); err != nil {
		return nil, err
	}
	copyTree := func(ctx context.Context, e *env, i int) (time.Duration, error) {
		dst := filepath.Join(e.dir, fmt.Sprintf("copytree-%d", i))
		defer os.RemoveAll(dst)
		if err := os.Mkdir(dst, 0o755); err != nil {
			return 0, err
		}
		start := time.Now()
		st, err := workspace.CopyTree(ctx, src, dst, workspace.CopyOptions{Owner: &workspace.SandboxOwner})
		d := time.Since(start)
		if err == nil && st.Files != int64(e.c.files) {
			err = fmt.Errorf("CopyTree copied %d files, want %d", st.Files, e.c.files)
		}
		return d, err
	}
	cpA := func(ctx context.Context, e *env, i int) (time.Duration, error) {
		dst := filepath.Join(e.dir, fmt.Sprintf("cp-%d", i))
		defer os.RemoveAll(dst)
		start := time.Now()
		out, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("cp -a: %w: %s", err, out)
		}
		return time.Since(start), nil
	}
	ds, err := alternate(ctx, e, e.c.copyRounds, cpA, copyTree)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("workspace materialization, %d files of 1 KiB in 100 dirs (median of %d)", e.c.files, e.c.copyRounds)
	return []row{ratioRow(what, median(ds[1]), median(ds[0]), "cp -a", 0)}, nil
}

// makeTree writes files 1 KiB files spread over 100 directories.
func makeTree(root string, files int) error {
	data := make([]byte, 1024)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for i := range files {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i%100))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.txt", i)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
