// Package instance gives each executor process an identity and lets other
// processes prove that an executor is gone.
//
// An executor calls Start at startup: it draws a fresh instance ID, creates
// DIR/<id>.lock, takes an exclusive flock(2) on it for as long as the process
// lives and writes its Info (PID, the process's start time from
// /proc/PID/stat, the host's boot ID) into it. The kernel drops the lock when
// the process dies, however it dies (SIGKILL included), so another process
// that can take the lock has proof that the executor is gone. When the lock
// file itself is missing, the recorded PID, start time and boot ID decide:
// a different boot, a PID that no longer exists or one that now belongs to a
// process started at another time all prove the executor gone.
//
// The executor labels its containers with its ID (dev.taskrun.instance), and
// journals it with every run, so that `taskrun gc` can tell its own and dead
// executors' containers and runs from those of executors still running.
package instance

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/taskrun/taskrun/model"
)

// lockSuffix ends every instance lock file's name.
const lockSuffix = ".lock"

// Info identifies one executor process.
type Info struct {
	// ID is the instance ID, unique per executor process.
	ID string `json:"id"`
	// PID is the executor's process ID.
	PID int `json:"pid"`
	// StartTicks is the process's start time in clock ticks since boot
	// (field 22 of /proc/PID/stat); with BootID it tells a reused PID apart.
	StartTicks uint64 `json:"start_ticks"`
	// BootID is the host's /proc/sys/kernel/random/boot_id at start.
	BootID string `json:"boot_id"`
}

// Instance is the running executor's identity and the lock that proves it
// alive. Close releases it.
type Instance struct {
	info Info
	dir  string
	lock *Lock
}

// Start creates a new instance in dir (created 0700 if missing): a fresh ID,
// and a held lock on dir/<ID>.lock recording Info.
func Start(dir string) (*Instance, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("instance: create %s: %w", dir, err)
	}
	self, err := Self()
	if err != nil {
		return nil, err
	}
	self.ID = NewID()
	l, err := TryLock(filepath.Join(dir, self.ID+lockSuffix))
	if err != nil {
		return nil, fmt.Errorf("instance: %w", err)
	}
	data, _ := json.Marshal(self)
	if err := l.WriteContent(data); err != nil {
		l.Unlock(true)
		return nil, fmt.Errorf("instance: record %s: %w", self.ID, err)
	}
	return &Instance{info: self, dir: dir, lock: l}, nil
}

// Info returns the instance's identity.
func (i *Instance) Info() Info { return i.info }

// ID returns the instance ID.
func (i *Instance) ID() string { return i.info.ID }

// Close releases the lock and removes the lock file: from then on the
// instance counts as gone.
func (i *Instance) Close() error { return i.lock.Unlock(true) }

// Process is the process record of info, "PID/START_TICKS/BOOT_ID", for a
// label on what the executor creates; ParseProcess reads it back.
func (info Info) Process() string {
	return fmt.Sprintf("%d/%d/%s", info.PID, info.StartTicks, info.BootID)
}

// ParseProcess returns the Info of executor id with the process record
// process (Info.Process); a malformed record gives the Info of id alone,
// which Gone never proves gone without a lock file.
func ParseProcess(id, process string) Info {
	info := Info{ID: id}
	parts := strings.SplitN(process, "/", 3)
	if len(parts) != 3 {
		return info
	}
	pid, err1 := strconv.Atoi(parts[0])
	ticks, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 || parts[2] == "" {
		return info
	}
	info.PID, info.StartTicks, info.BootID = pid, ticks, parts[2]
	return info
}

// NewID returns a fresh instance ID ("x" and 16 random base32 characters),
// valid as a taskrun ID and as a label value.
func NewID() string { return "x" + strings.ToLower(rand.Text()[:16]) }

// Self returns the calling process's Info without an ID.
func Self() (Info, error) {
	pid := os.Getpid()
	ticks, err := startTicks(pid)
	if err != nil {
		return Info{}, fmt.Errorf("instance: own start time: %w", err)
	}
	boot, err := bootID()
	if err != nil {
		return Info{}, fmt.Errorf("instance: boot ID: %w", err)
	}
	return Info{PID: pid, StartTicks: ticks, BootID: boot}, nil
}

// Gone reports whether the executor described by info is provably gone, and
// why (or why it counts as alive). dir is where instances keep their lock
// files. An ID that is not a valid taskrun ID is never proven gone.
func Gone(dir string, info Info) (bool, string, error) {
	if err := model.ValidateID("instance", info.ID); err != nil {
		return false, "", err
	}
	path := filepath.Join(dir, info.ID+lockSuffix)
	held, err := Held(path)
	switch {
	case err == nil && held:
		return false, fmt.Sprintf("executor %s holds its lock", info.ID), nil
	case err == nil:
		return true, fmt.Sprintf("executor %s released its lock (pid %d exited)", info.ID, info.PID), nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, "", err
	}
	return processGone(info)
}

// processGone decides from PID, start time and boot ID alone.
func processGone(info Info) (bool, string, error) {
	if info.PID <= 0 || info.BootID == "" {
		return false, fmt.Sprintf("executor %s has no lock file and no process record", info.ID), nil
	}
	boot, err := bootID()
	if err != nil {
		return false, "", err
	}
	if boot != info.BootID {
		return true, fmt.Sprintf("executor %s ran before the host rebooted", info.ID), nil
	}
	ticks, err := startTicks(info.PID)
	if errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Sprintf("executor %s: pid %d no longer exists", info.ID, info.PID), nil
	}
	if err != nil {
		return false, "", err
	}
	if ticks != info.StartTicks {
		return true, fmt.Sprintf("executor %s: pid %d now belongs to another process", info.ID, info.PID), nil
	}
	return false, fmt.Sprintf("executor %s: pid %d is still running", info.ID, info.PID), nil
}

// List returns the Info of every instance with a lock file in dir, alive or
// not; unreadable files are skipped.
func List(dir string) ([]Info, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("instance: %w", err)
	}
	var out []Info
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), lockSuffix)
		if !ok || model.ValidateID("instance", id) != nil {
			continue
		}
		var info Info
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || json.Unmarshal(data, &info) != nil || info.ID != id {
			info = Info{ID: id}
		}
		out = append(out, info)
	}
	return out, nil
}

// RemoveIfGone removes the lock file of an instance that is gone (taking its
// lock first, so a live instance's file is never removed), and reports
// whether it did.
func RemoveIfGone(dir, id string) (bool, error) {
	if err := model.ValidateID("instance", id); err != nil {
		return false, err
	}
	l, err := TryLock(filepath.Join(dir, id+lockSuffix))
	if errors.Is(err, ErrLocked) || errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, l.Unlock(true)
}

// startTicks reads field 22 (starttime) of /proc/PID/stat.
func startTicks(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself: the fields after it start after the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	const starttime = 22 - 3 // fields[0] is field 3 (state)
	if len(fields) <= starttime {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[starttime], 10, 64)
}

// bootID is the host's boot ID.
func bootID() (string, error) {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// errnoIs reports whether err is the errno e.
func errnoIs(err error, e syscall.Errno) bool {
	var errno syscall.Errno
	return errors.As(err, &errno) && errno == e
}
