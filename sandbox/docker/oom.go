package docker

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
)

// The engine sets State.OOMKilled from the runtime's OOM event. Under gVisor
// (runsc) that event is sometimes lost when several sandboxes run at once:
// the container exits 137 with OOMKilled false. The backend therefore also
// watches the container's memory cgroup (cgroup v1, engine on this host) while
// it runs, and reports an OOM kill when the kernel counted one there
// (memory.oom_control oom_kill) or the cgroup hit its limit (memory.failcnt)
// and the container then died of SIGKILL without being stopped by the
// backend. On cgroup v2, or with a remote engine whose cgroups are not
// visible here, only the engine's flag is reported (see nomad #13119).

// memoryPollInterval is how often the memory cgroup is sampled.
const memoryPollInterval = 50 * time.Millisecond

// cgroupRoots are where a container's v1 memory cgroup lives, for the
// cgroupfs and the systemd cgroup drivers.
var cgroupRoots = []string{
	"/sys/fs/cgroup/memory/docker/%s",
	"/sys/fs/cgroup/memory/system.slice/docker-%s.scope",
}

// memoryWatch records what the container's memory cgroup showed.
type memoryWatch struct {
	hitLimit atomic.Bool // failcnt > 0 or oom_kill > 0 was seen
}

// watch samples the memory cgroup of container id until done is closed.
func (m *memoryWatch) watch(id string, done <-chan struct{}) {
	dir := memoryCgroupDir(id)
	if dir == "" {
		return
	}
	t := time.NewTicker(memoryPollInterval)
	defer t.Stop()
	for {
		if limitHit(dir) {
			m.hitLimit.Store(true)
			return
		}
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// memoryCgroupDir is the container's v1 memory cgroup, or "" when not found.
func memoryCgroupDir(id string) string {
	for _, root := range cgroupRoots {
		dir := filepath.Clean(fmt.Sprintf(root, id))
		if _, err := os.Stat(filepath.Join(dir, "memory.failcnt")); err == nil {
			return dir
		}
	}
	return ""
}

// limitHit reports whether the cgroup in dir reached its memory limit or had
// a process OOM-killed.
func limitHit(dir string) bool {
	if n, err := readInt(filepath.Join(dir, "memory.failcnt")); err == nil && n > 0 {
		return true
	}
	data, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("oom_kill ")); ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			return err == nil && n > 0
		}
	}
	return false
}

func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(data)), 10, 64)
}
