package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The file API's watch (GET PathFiles with op=watch) streams a path's
// changes under the run's home as newline-delimited WatchEvents: first
// "watching", then "created", "modified" and "removed" of the path's
// entries (a directory's, not recursive) or of the path itself. It ends
// when the path is removed or moved, the caller goes or the run ends.
const (
	// MaxWatchesPerRun bounds a run's watches at a time; one more is 429.
	MaxWatchesPerRun = 8
	// MaxWatches bounds the daemon's watches at a time, over all runs:
	// each holds an inotify instance of the daemon's user, whose count the
	// kernel limits per user (fs.inotify.max_user_instances, often 128),
	// so runs cannot together take what the host needs. One more is 429.
	MaxWatches = 32
	// MaxWatchEventsPerSecond bounds a watch's events: those over it are
	// dropped and counted in an "overflow" event.
	MaxWatchEventsPerSecond = 500
	// watchQueue is how many events wait for a slow caller before the
	// next are dropped (and counted) as well.
	watchQueue = 256
)

// WatchEvent is one line of a watch: Event is "watching", "created",
// "modified", "removed" or "overflow" (Dropped events were lost); Path is
// relative to the run's home.
type WatchEvent struct {
	Event   string `json:"event"`
	Path    string `json:"path,omitempty"`
	Dir     bool   `json:"dir,omitempty"`
	Dropped int64  `json:"dropped,omitempty"`
}

// watchMask is what a watch hears of its inode.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_CLOSE_WRITE |
	unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// serveWatch streams the changes of name under root, the run's home.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request, run *liveRun, root *os.Root, name string) {
	if n := run.watches.Add(1); n > MaxWatchesPerRun {
		run.watches.Add(-1)
		refuse(w, http.StatusTooManyRequests, fmt.Errorf("run %s: %d watches already", run.ref.RunID, MaxWatchesPerRun))
		return
	}
	defer run.watches.Add(-1)
	if n := s.watches.Add(1); n > MaxWatches {
		s.watches.Add(-1)
		refuse(w, http.StatusTooManyRequests, fmt.Errorf("the daemon holds %d watches already: try again when one ends", MaxWatches))
		return
	}
	defer s.watches.Add(-1)
	// os.Root opens the path: a traversal or a symlink out of the home is
	// refused as by the other file calls.
	f, err := root.Open(name)
	if err != nil {
		fileError(w, err)
		return
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		fileError(w, err)
		return
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		f.Close()
		refuse(w, http.StatusServiceUnavailable, fmt.Errorf("watch: %w", err))
		return
	}
	ino := os.NewFile(uintptr(fd), "inotify")
	defer ino.Close()
	// The watch is on the inode os.Root opened, named by its descriptor:
	// a symlink or a rename after the check cannot point it elsewhere.
	// The descriptor is closed once the watch holds: open, it would keep a
	// removed file's inode, and its removal unheard.
	_, err = unix.InotifyAddWatch(fd, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), watchMask)
	f.Close()
	if err != nil {
		refuse(w, http.StatusConflict, fmt.Errorf("watch %s: %w", name, err))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(run.ctx, cancel)
	defer stop()

	events := make(chan WatchEvent, watchQueue)
	var dropped atomic.Int64
	go readWatch(ino, name, events, &dropped)

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(e WatchEvent) bool {
		if enc.Encode(e) != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send(WatchEvent{Event: "watching", Path: name, Dir: fi.IsDir()}) {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events:
			if n := dropped.Swap(0); n > 0 && !send(WatchEvent{Event: "overflow", Dropped: n}) {
				return
			}
			if !ok || !send(e) {
				return
			}
		}
	}
}

// readWatch reads the inotify descriptor ino into events until it is
// closed or the watched path goes (its last event is that path's
// "removed"), then closes events. An event that finds events full, or is
// over the rate, is counted in dropped.
func readWatch(ino *os.File, name string, events chan<- WatchEvent, dropped *atomic.Int64) {
	defer close(events)
	buf := make([]byte, 64<<10)
	second, count := time.Now(), 0
	emit := func(e WatchEvent) {
		if now := time.Now(); now.Sub(second) >= time.Second {
			second, count = now, 0
		}
		count++
		if count > MaxWatchEventsPerSecond {
			dropped.Add(1)
			return
		}
		select {
		case events <- e:
		default:
			dropped.Add(1)
		}
	}
	for {
		n, err := ino.Read(buf)
		if err != nil {
			return
		}
		var last WatchEvent
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			entry := string(trimNUL(buf[off+unix.SizeofInotifyEvent : end]))
			off = end
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				dropped.Add(1)
				continue
			}
			if ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED|unix.IN_UNMOUNT) != 0 {
				emit(WatchEvent{Event: "removed", Path: name})
				return
			}
			e := WatchEvent{Path: name, Dir: ev.Mask&unix.IN_ISDIR != 0}
			if entry != "" {
				e.Path = path.Join(name, entry)
			}
			switch {
			case ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				e.Event = "created"
			case ev.Mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
				e.Event = "removed"
			case ev.Mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0:
				e.Event = "modified"
			default:
				continue
			}
			// One write is several modifications in a read: say it once.
			if e == last {
				continue
			}
			last = e
			emit(e)
		}
	}
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
