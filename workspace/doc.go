// Package workspace lays out a run's directories on the host and moves files
// in and out of them without trusting what is inside.
//
// Everything the sandboxed agent can write (the run's home, artifacts, global
// and output directories, and any session archive it produced) is treated as
// hostile input: symlinks to host files or other tenants' directories, FIFOs
// that would block a reader, device nodes, entries named "../x" and archives
// that expand to terabytes. The functions here never follow a symlink out of the
// tree they work on, never block on a special file, cap what they read, and
// report every entry they leave out together with the reason.
//
// Traversal goes through [os.Root] one directory at a time: every entry is
// Lstat-ed by a single name inside its parent's Root, regular files are opened
// with O_NOFOLLOW|O_NONBLOCK and fstat-ed again, and an entry whose identity
// (device and inode) changed between the two is skipped as "replaced during
// walk". Directories on another filesystem (mount points) are not crossed.
//
// A typical run uses the package in this order:
//
//	dirs, err := paths.Run(ref) // validates every ID of the model.RunRef
//	err = workspace.CreateRunDirs(dirs, workspace.SandboxOwner)
//	_, err = workspace.UnpackHome(ctx, sessionArchive, dirs.Home, workspace.UnpackOptions{Owner: &owner})
//	_, err = workspace.CopyTree(ctx, workspaceDir, dirs.Home, workspace.CopyOptions{Owner: &owner, KeepExisting: true})
//	// ... run the container, wait until it has stopped ...
//	_, err = workspace.PackHome(ctx, dirs.Home, upload, workspace.PackOptions{Exclude: workspace.DefaultExcludes})
//	_, err = workspace.Collect(ctx, dirs.Artifacts, workspace.CollectOptions{}, store)
//
// UnpackHome needs an empty (or missing) home, so the session state is restored
// first and the task's files are copied over it afterwards; KeepExisting keeps
// the restored (newer) version of a file that both contain.
package workspace
