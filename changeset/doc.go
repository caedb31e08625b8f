// Package changeset computes what a run changed in its workspace: a patch
// in git's format that `git apply` applies to the starting tree, the list of
// changed paths with sizes and SHA-256 digests (changes.json), and a hash of
// the final tree.
//
// The executor calls Snapshot after it has materialized the run's home and
// before the agent starts, with a directory of its own (never inside the run
// directory), and Compute after the container has stopped:
//
//	err := changeset.Snapshot(ctx, dirs.Home, privateDir, changeset.Options{Workspace: workspaceDir})
//	// ... the agent runs ...
//	set, err := changeset.Compute(ctx, privateDir, dirs.Home, patchFile)
//
// Snapshot keeps the starting content (up to Limits.MaxBaseBytes) in that
// directory, so the agent cannot rewrite the "before" side of its own diff.
// The final home is hostile: it is walked once through workspace.Scan,
// symlinks are recorded as symlinks and never followed, special files are
// skipped with a reason, and the content the patch needs is copied out,
// within caps, before it is diffed.
//
// When the original workspace is a git work tree, the change set records its
// HEAD as the base commit and leaves out paths its ignore rules (the
// starting tree's .gitignore files and .git/info/exclude) ignore, unless the
// base commit tracks them. Git runs only on the host's own copy of the
// workspace and on a scratch repository in the private directory, with the
// system and global configuration off and fsmonitor and hooks disabled;
// never on the run's home, whose .git the agent controls. Directories named
// .git are never part of a change set.
package changeset
