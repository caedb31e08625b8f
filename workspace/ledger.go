package workspace

import (
	"fmt"
	"io/fs"
	"sync"
	"syscall"
)

// SparseAllowance is how far a file's size may exceed the bytes the
// filesystem really allocated for it before collection refuses to read it:
// room for small files stored inline and for the last partial block. A file
// whose size is larger than its allocated blocks plus this allowance is
// mostly holes (a sparse file): reading it would make the host read, hash
// and store bytes that were never written.
const SparseAllowance int64 = 64 << 10

// allocated is the bytes the filesystem allocated for the file info
// describes, or its size when the platform does not say.
func allocated(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}

// IsSparse reports whether a file of size bytes with allocated bytes of
// blocks is mostly holes: larger than its blocks plus SparseAllowance.
func IsSparse(size, allocated int64) bool {
	return size > allocated+SparseAllowance
}

// Ledger is what the collection of one run has read so far. The Collect
// and PackHome calls of a run share one, so that the run's total is capped
// across its artifacts, output, traces and session state, and a file
// hard-linked into several of them (or several times into one) is read once.
// It is safe for concurrent use.
type Ledger struct {
	mu    sync.Mutex
	limit int64
	read  int64
	seen  map[fileID]string
}

// fileID is a file's identity: device and inode.
type fileID struct{ dev, ino uint64 }

// NewLedger returns a ledger that admits at most limit bytes in total
// (limit <= 0 means DefaultCollectMaxTotalBytes).
func NewLedger(limit int64) *Ledger {
	if limit <= 0 {
		limit = DefaultCollectMaxTotalBytes
	}
	return &Ledger{limit: limit, seen: map[fileID]string{}}
}

// Limit is the total the ledger admits.
func (l *Ledger) Limit() int64 { return l.limit }

// Read is the total admitted so far.
func (l *Ledger) Read() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.read
}

// admit decides whether the regular file at rel, whose fstat result is
// info, may be read, and counts it if so. A non-empty reason means it must
// be skipped.
func (l *Ledger) admit(rel string, info fs.FileInfo) string {
	size := info.Size()
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return "cannot tell the file's allocated size or identity"
	}
	if allocated := st.Blocks * 512; IsSparse(size, allocated) {
		return fmt.Sprintf("sparse file: %d bytes long but only %d allocated (holes are not read)", size, allocated)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	id := fileID{dev: uint64(st.Dev), ino: st.Ino} //nolint:unconvert // Dev is uint32 on some platforms
	if st.Nlink > 1 {
		if first, dup := l.seen[id]; dup {
			return fmt.Sprintf("hard link to a file already read as %q", first)
		}
	}
	if size > l.limit-l.read {
		return fmt.Sprintf("file of %d bytes would exceed the run's collection total of %d bytes", size, l.limit)
	}
	if st.Nlink > 1 {
		l.seen[id] = rel
	}
	l.read += size
	return ""
}
