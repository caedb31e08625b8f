package probe

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// applyStatus fills the credential, capability, NoNewPrivs and Seccomp fields
// of r from the text of /proc/self/status.
func applyStatus(r *Report, status io.Reader) error {
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		var err error
		switch key {
		case "Uid":
			r.UID, err = firstInt(val)
		case "Gid":
			r.GID, err = firstInt(val)
		case "CapEff":
			r.CapEff, err = strconv.ParseUint(val, 16, 64)
		case "CapPrm":
			r.CapPrm, err = strconv.ParseUint(val, 16, 64)
		case "CapBnd":
			r.CapBnd, err = strconv.ParseUint(val, 16, 64)
		case "CapAmb":
			r.CapAmb, err = strconv.ParseUint(val, 16, 64)
		case "NoNewPrivs":
			r.NoNewPrivs, err = strconv.Atoi(val)
		case "Seccomp":
			r.Seccomp, err = strconv.Atoi(val)
		}
		if err != nil {
			return fmt.Errorf("status field %s=%q: %w", key, val, err)
		}
	}
	return sc.Err()
}

func firstInt(s string) (int, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("empty id list")
	}
	return strconv.Atoi(f[0])
}

// parseMountinfo decodes /proc/self/mountinfo (proc(5)).
func parseMountinfo(in io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 2 {
			return nil, fmt.Errorf("malformed mountinfo line %q", sc.Text())
		}
		m := Mount{Root: unescapeOctal(f[3]), Target: unescapeOctal(f[4]), Options: f[5], FSType: g[0], Source: unescapeOctal(g[1])}
		for _, o := range strings.Split(f[5], ",") {
			if o == "ro" {
				m.ReadOnly = true
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeOctal undoes mountinfo's \040-style escaping of spaces and the like.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountAt returns the topmost mount at target (later entries overmount
// earlier ones).
func mountAt(mounts []Mount, target string) (Mount, bool) {
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].Target == target {
			return mounts[i], true
		}
	}
	return Mount{}, false
}

// parseLimit decodes a cgroup limit file: "max" (v2) or a number; v1's
// page-rounded "unlimited" memory value is reported as Unlimited.
func parseLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return Unlimited, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return Unknown, fmt.Errorf("cgroup limit %q: %w", s, err)
	}
	if v >= 1<<62 {
		return Unlimited, nil
	}
	return v, nil
}
