package audit

import (
	"fmt"
	"path"
	"strings"

	"github.com/taskrun/taskrun/sandbox"
)

// mountClass says which rule a mount is attributed to.
type mountClass int

const (
	mountOK         mountClass = iota
	mountSocket                // rule 5.32
	mountSensitive             // rule 5.6
	mountNotAllowed            // rule TR:only-run-mount
)

// runtimeSockets are the names of container-runtime API sockets.
var runtimeSockets = []string{"docker.sock", "containerd.sock", "podman.sock", "crio.sock", "containerd-shim", "dockershim.sock", "buildkitd.sock"}

// runDirs hold runtime sockets; nothing under them may be mounted.
var runDirs = []string{"/run", "/var/run"}

// sensitiveTrees may not be mounted, nor anything under them.
var sensitiveTrees = []string{"/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sys", "/usr", "/bin", "/sbin", "/root", "/var/lib/docker", "/var/lib/containerd", "/var/log"}

// sensitiveExact may not be mounted themselves (their subdirectories may hold
// legitimate run dirs, e.g. /var/lib/taskrun).
var sensitiveExact = []string{"/", "/var", "/home", "/opt", "/srv", "/tmp", "/var/lib"}

func under(p, root string) bool {
	return p == root || strings.HasPrefix(p, root+"/")
}

func isSocketMount(m Mount) bool {
	src, dst := path.Clean("/"+m.Source), path.Clean("/"+m.Destination)
	for _, s := range runtimeSockets {
		if strings.Contains(path.Base(src), s) || strings.Contains(path.Base(dst), s) {
			return true
		}
	}
	if m.Type != "bind" {
		return false
	}
	for _, d := range runDirs {
		if under(src, d) {
			return true
		}
	}
	return false
}

func isSensitiveMount(m Mount) bool {
	if m.Type != "bind" {
		return false
	}
	src := path.Clean("/" + m.Source)
	for _, t := range sensitiveTrees {
		if under(src, t) {
			return true
		}
	}
	for _, e := range sensitiveExact {
		if src == e {
			return true
		}
	}
	return false
}

// below reports whether p lies strictly below root.
func below(p, root string) bool {
	return p != root && under(p, root)
}

// runDirAllowed reports whether src may be mounted at RunDirTarget: it must be
// strictly below RunsRoot when that is set, and be the policy's RunDir, else
// the sandbox.LabelRunDir path (trusted only strictly below RunsRoot), else a dir
// named after the sandbox.LabelRun value; the second result says what was expected.
func (c checkCtx) runDirAllowed(src string) (bool, string) {
	mp := c.opts.Mounts
	root := path.Clean(mp.RunsRoot)
	if mp.RunsRoot != "" && !below(src, root) {
		return false, fmt.Sprintf("run dir %s is not strictly below %s", src, mp.RunsRoot)
	}
	label := c.p.Labels[sandbox.LabelRunDir]
	switch {
	case mp.RunDir != "":
		return src == path.Clean(mp.RunDir), "expected " + mp.RunDir
	case label != "" && mp.RunsRoot != "" && below(path.Clean(label), root):
		want := path.Clean(label)
		return src == want, "expected " + want + " (label " + sandbox.LabelRunDir + ")"
	case c.p.Labels[sandbox.LabelRun] != "":
		run := c.p.Labels[sandbox.LabelRun]
		return path.Base(src) == run, "expected a dir named " + run + " (label " + sandbox.LabelRun + ")"
	}
	return false, "cannot tie it to the run: no " + sandbox.LabelRun + " label, and no " + sandbox.LabelRunDir + " label below a configured RunsRoot"
}

// helperAllowed reports whether a bind mount under HelperTarget is allowed,
// and if not, why.
func (c checkCtx) helperAllowed(m Mount) (bool, string) {
	dst := path.Clean("/" + m.Destination)
	if m.RW {
		return false, fmt.Sprintf("helper %s is writable", dst)
	}
	if dir := c.opts.Mounts.HelpersDir; dir != "" && !under(path.Clean("/"+m.Source), path.Clean(dir)) {
		return false, fmt.Sprintf("helper %s from %s is not from the helpers dir %s", dst, m.Source, dir)
	}
	if pins := c.opts.Mounts.HelperFiles; len(pins) > 0 {
		want, ok := pins[dst]
		if !ok {
			return false, fmt.Sprintf("helper %s is not one of the run's helper files", dst)
		}
		if path.Clean("/"+m.Source) != path.Clean(want) {
			return false, fmt.Sprintf("helper %s from %s, want %s", dst, m.Source, want)
		}
	}
	return true, ""
}

func (c checkCtx) classify(m Mount) (mountClass, string) {
	switch {
	case isSocketMount(m):
		return mountSocket, ""
	case isSensitiveMount(m):
		return mountSensitive, ""
	case m.Type == "tmpfs":
		return mountOK, ""
	}
	dst := path.Clean("/" + m.Destination)
	switch {
	case dst == RunDirTarget && m.Type == "bind":
		src := path.Clean("/" + m.Source)
		if ok, why := c.runDirAllowed(src); !ok {
			return mountNotAllowed, fmt.Sprintf("%s from %s: %s", dst, src, why)
		}
		return mountOK, ""
	case under(dst, HelperTarget) && m.Type == "bind" && !c.opts.Mounts.ForbidHelpers:
		if ok, why := c.helperAllowed(m); !ok {
			return mountNotAllowed, why
		}
		return mountOK, ""
	}
	return mountNotAllowed, fmt.Sprintf("%s %s from %q", m.Type, dst, m.Source)
}

func (c checkCtx) mountsOf(class mountClass) []string {
	var out []string
	for _, m := range c.p.Mounts {
		got, why := c.classify(m)
		if got != class {
			continue
		}
		if why == "" {
			why = fmt.Sprintf("%s -> %s", m.Source, m.Destination)
		}
		out = append(out, why)
	}
	return out
}

func checkSockets(c checkCtx) (Status, string) {
	if bad := c.mountsOf(mountSocket); len(bad) > 0 {
		return fail("runtime socket or /run mounted: %s", strings.Join(bad, "; "))
	}
	return pass("no runtime socket or /run mount")
}

func checkSensitiveDirs(c checkCtx) (Status, string) {
	if bad := c.mountsOf(mountSensitive); len(bad) > 0 {
		return fail("sensitive host path mounted: %s", strings.Join(bad, "; "))
	}
	return pass("no sensitive host path mounted")
}

func checkOnlyRunMount(c checkCtx) (Status, string) {
	if bad := c.mountsOf(mountNotAllowed); len(bad) > 0 {
		return fail("mounts outside the policy: %s", strings.Join(bad, "; "))
	}
	return pass("%d mounts, all allowed (sockets and sensitive paths are judged by 5.32 and 5.6)", len(c.p.Mounts))
}
