package persist

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// What a key path may hold beyond being clean and relative. Agents choose
// the names of the files a run stores, so every name is checked against what
// each backend can store and what a person reading a listing can trust.
const (
	// maxElemLen bounds one path element. Filesystems cap a name at 255
	// bytes, and the file:// driver stores an object next to names 21 bytes
	// longer (its temporary file, "<name>.<hex>.tmp", and "<name>.attrs").
	maxElemLen = 200
	// reservedSuffix ends the attribute files of the file:// driver, which
	// refuses object names ending with it.
	reservedSuffix = ".attrs"
)

// ErrReservedName marks an agent-written file whose path names a record the
// executor keeps for a run (a run's trace or gateway record): storing it
// would replace, or pre-empt, that record.
var ErrReservedName = errors.New("persist: name reserved for a run's own record")

// Names of the records each run keeps in run-global storage, in
// "traces/<session>/".
const (
	traceFilePrefix   = "rt_"
	gatewayFilePrefix = "gw_"
	recordFileExt     = ".jsonl"
)

// unsafeRune reports whether r may not appear in a key: C0 and C1 control
// characters, DEL, and the Unicode bidirectional formatting characters
// (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069), which make a
// listed name read differently from what it is.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// checkElem checks one element of a clean relative path.
func checkElem(p, elem string) error {
	switch {
	case elem == ".." || elem == ".":
		return fmt.Errorf("%w: path %q has a %q element: name files and directories explicitly", ErrInvalidName, p, elem)
	case len(elem) > maxElemLen:
		return fmt.Errorf("%w: path %q has a %d-byte element: keep each at most %d", ErrInvalidName, p, len(elem), maxElemLen)
	case strings.HasSuffix(elem, reservedSuffix):
		return fmt.Errorf("%w: path %q has an element ending in %q, which the file store reserves: rename it", ErrInvalidName, p, reservedSuffix)
	}
	return nil
}

// CheckAgentGlobalPath checks the run-global path of a file the agent of run
// runID wrote, before it is stored with PutGlobalFile: it must be a valid
// key path (ValidateRelPath), and it must not name another run's trace
// ("traces/<session>/rt_<other run>.jsonl") nor any run's gateway record
// ("traces/<session>/gw_<run>.jsonl"), whichever directory of traces/ it is
// in. Those keys are written only by the executor of their own run, so no
// run can replace or pre-empt another run's records. The error wraps
// ErrInvalidName or ErrReservedName and says why.
func CheckAgentGlobalPath(runID, relPath string) error {
	if err := validateID("run", runID); err != nil {
		return err
	}
	if err := ValidateRelPath(relPath); err != nil {
		return err
	}
	if !strings.HasPrefix(relPath, tracesDir+"/") {
		return nil
	}
	base := path.Base(relPath)
	if !strings.HasSuffix(base, recordFileExt) {
		return nil
	}
	switch {
	case strings.HasPrefix(base, gatewayFilePrefix):
		return fmt.Errorf("%w: %q is the name of a run's gateway record, which only the executor writes", ErrReservedName, relPath)
	case strings.HasPrefix(base, traceFilePrefix) && base != traceFilePrefix+runID+recordFileExt:
		return fmt.Errorf("%w: %q is the name of another run's trace; this run's trace is %s", ErrReservedName, relPath, traceFilePrefix+runID+recordFileExt)
	}
	return nil
}
