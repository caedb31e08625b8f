package audit

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	units "github.com/docker/go-units"
)

// tmpfsProblem says what a HostConfig.Tmpfs option string lacks, or "" when
// it has nosuid, nodev and a positive size. Later options override earlier
// ones, as in mount(8).
func tmpfsProblem(opts string) string {
	nosuid, nodev, size := false, false, ""
	for _, o := range strings.Split(opts, ",") {
		switch o = strings.TrimSpace(o); {
		case o == "nosuid" || o == "suid":
			nosuid = o == "nosuid"
		case o == "nodev" || o == "dev":
			nodev = o == "nodev"
		case strings.HasPrefix(o, "size="):
			size = strings.TrimPrefix(o, "size=")
		}
	}
	var missing []string
	if !nosuid {
		missing = append(missing, "nosuid")
	}
	if !nodev {
		missing = append(missing, "nodev")
	}
	if !positiveTmpfsSize(size) {
		missing = append(missing, "a positive size= (size=0 or none is unbounded)")
	}
	if len(missing) == 0 {
		return ""
	}
	return "lacks " + strings.Join(missing, ", ")
}

// positiveTmpfsSize accepts a tmpfs size such as 16m, 65536k, 1g, 1048576
// or 50%, and rejects an empty or zero size.
func positiveTmpfsSize(s string) bool {
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.Atoi(pct)
		return err == nil && n > 0
	}
	n, err := units.RAMInBytes(s)
	return err == nil && n > 0
}

func checkTmpfs(c checkCtx) (Status, string) {
	var bad []string
	for _, m := range c.p.Mounts {
		if m.Type == "tmpfs" {
			bad = append(bad, fmt.Sprintf("%s is a Mounts tmpfs whose options the posture does not record; use HostConfig.Tmpfs", path.Clean("/"+m.Destination)))
		}
	}
	dsts := make([]string, 0, len(c.p.Tmpfs))
	for dst := range c.p.Tmpfs {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	for _, dst := range dsts {
		if why := tmpfsProblem(c.p.Tmpfs[dst]); why != "" {
			bad = append(bad, fmt.Sprintf("%s %q %s", dst, c.p.Tmpfs[dst], why))
		}
	}
	if len(bad) > 0 {
		return fail("tmpfs mounts not hardened: %s", strings.Join(bad, "; "))
	}
	return pass("%d tmpfs mounts, each nosuid, nodev and size-capped", len(dsts))
}
