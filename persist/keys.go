package persist

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/taskrun/taskrun/model"
)

// ErrInvalidName marks an ID, object name or relative path that cannot form a
// safe, tenant-scoped key. Such input is refused before any I/O.
var ErrInvalidName = errors.New("persist: invalid name")

const (
	// maxRelPathLen bounds relative paths so keys stay within every
	// backend's key length limit (S3 and GCS: 1024 bytes).
	maxRelPathLen = 768
	// tenantsRoot is the first element of every key the store writes.
	tenantsRoot = "tenants"
	// artifactsDir holds a run's artifacts; no run file may use this name.
	artifactsDir = "artifacts"
	// digestsDir holds the digest records of streamed uploads (see put.go).
	digestsDir = "digests"
)

// objectKey is a validated key split into its tenant and the rest, so the
// store can derive the tenant-scoped digest record key from it.
type objectKey struct {
	userID string
	rest   string
}

// String returns the full bucket key.
func (k objectKey) String() string {
	return tenantsRoot + "/" + k.userID + "/" + k.rest
}

// digestKey returns the key of the digest record kept for a streamed upload
// of k. It lives in the same tenant, in a namespace no builder can reach.
func (k objectKey) digestKey() string {
	return tenantsRoot + "/" + k.userID + "/" + digestsDir + "/" + k.rest
}

// validateID checks an ID with model.ValidateID; the error also wraps
// ErrInvalidName, as every key error does.
func validateID(kind, id string) error {
	if err := model.ValidateID(kind, id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	return nil
}

// ValidateRelPath checks that p is a clean, relative, slash-separated path
// that every backend can store: valid UTF-8, at most 768 bytes, no "." or
// ".." element, no backslash, no C0 or C1 control character, no Unicode
// bidirectional formatting character, no element longer than 200 bytes and
// no element ending in ".attrs" (which the file:// driver reserves).
func ValidateRelPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: empty path: give a relative path such as \"dir/file.txt\"", ErrInvalidName)
	case len(p) > maxRelPathLen:
		return fmt.Errorf("%w: path is %d bytes: keep it at most %d", ErrInvalidName, len(p), maxRelPathLen)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: path %q is not valid UTF-8", ErrInvalidName, p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: path %q is absolute: drop the leading \"/\"", ErrInvalidName, p)
	case strings.ContainsRune(p, '\\'):
		return fmt.Errorf("%w: path %q contains a backslash: separate elements with \"/\"", ErrInvalidName, p)
	case strings.ContainsFunc(p, unsafeRune):
		return fmt.Errorf("%w: path %q contains a control or bidirectional formatting character", ErrInvalidName, p)
	}
	for _, elem := range strings.Split(p, "/") {
		if err := checkElem(p, elem); err != nil {
			return err
		}
	}
	if path.Clean(p) != p {
		return fmt.Errorf("%w: path %q is not clean: use %q", ErrInvalidName, p, path.Clean(p))
	}
	return nil
}

// validateRunName checks a run file name: a clean relative path (such as
// "output.log" or "output/result.md") whose first element is not the
// artifacts directory, so run files never alias artifacts.
func validateRunName(name string) error {
	if err := ValidateRelPath(name); err != nil {
		return err
	}
	if first, _, _ := strings.Cut(name, "/"); first == artifactsDir {
		return fmt.Errorf("%w: run file name %q is under %q, which is reserved for artifacts: use PutArtifact", ErrInvalidName, name, artifactsDir)
	}
	return nil
}

// validateRef checks every ID of the run reference; the error also wraps
// ErrInvalidName, as every key error does.
func validateRef(ref RunRef) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	return nil
}

// runRest is the run's prefix below its tenant, with a trailing slash.
func runRest(r RunRef) string {
	return "conversations/" + r.ConversationID + "/tasks/" + r.TaskID + "/runs/" + r.RunID + "/"
}

func runKey(ref RunRef, name string) (objectKey, error) {
	if err := validateRef(ref); err != nil {
		return objectKey{}, err
	}
	if err := validateRunName(name); err != nil {
		return objectKey{}, err
	}
	return objectKey{userID: ref.UserID, rest: runRest(ref) + name}, nil
}

func artifactKey(ref RunRef, relPath string) (objectKey, error) {
	if err := validateRef(ref); err != nil {
		return objectKey{}, err
	}
	if err := ValidateRelPath(relPath); err != nil {
		return objectKey{}, err
	}
	return objectKey{userID: ref.UserID, rest: runRest(ref) + artifactsDir + "/" + relPath}, nil
}

func globalKey(userID, relPath string) (objectKey, error) {
	if err := validateID("user", userID); err != nil {
		return objectKey{}, err
	}
	if err := ValidateRelPath(relPath); err != nil {
		return objectKey{}, err
	}
	return objectKey{userID: userID, rest: "global/" + relPath}, nil
}

// parseKey splits a full key written by this package back into its tenant
// and rest, validating both.
func parseKey(key string) (objectKey, error) {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) != 3 || parts[0] != tenantsRoot {
		return objectKey{}, fmt.Errorf("%w: key %q is not of the form \"tenants/<user>/...\": build keys with RunKey, ArtifactKey or GlobalKey", ErrInvalidName, key)
	}
	if err := validateID("user", parts[1]); err != nil {
		return objectKey{}, err
	}
	if err := ValidateRelPath(parts[2]); err != nil {
		return objectKey{}, err
	}
	return objectKey{userID: parts[1], rest: parts[2]}, nil
}

// RunKey returns the key of a run file:
// "tenants/<user>/conversations/<c>/tasks/<t>/runs/<r>/<name>".
// name is a single path element other than "artifacts".
func RunKey(ref RunRef, name string) (string, error) {
	k, err := runKey(ref, name)
	return k.String(), err
}

// ArtifactKey returns the key of a run artifact:
// "tenants/<user>/conversations/<c>/tasks/<t>/runs/<r>/artifacts/<relPath>".
func ArtifactKey(ref RunRef, relPath string) (string, error) {
	k, err := artifactKey(ref, relPath)
	return k.String(), err
}

// GlobalKey returns the key of a tenant's run-global file:
// "tenants/<user>/global/<relPath>".
func GlobalKey(userID, relPath string) (string, error) {
	k, err := globalKey(userID, relPath)
	return k.String(), err
}

// RunPrefix returns the key prefix (ending in "/") under which all of a run's
// files and artifacts live.
func RunPrefix(ref RunRef) (string, error) {
	if err := validateRef(ref); err != nil {
		return "", err
	}
	return objectKey{userID: ref.UserID, rest: runRest(ref)}.String(), nil
}

// TenantPrefix returns the key prefix (ending in "/") of everything stored
// for userID.
func TenantPrefix(userID string) (string, error) {
	if err := validateID("user", userID); err != nil {
		return "", err
	}
	return tenantsRoot + "/" + userID + "/", nil
}

// tracesDir is the run-global directory holding every session's traces.
const tracesDir = "traces"

// TracePath returns the run-global relative path of an agent run's trace,
// "traces/<session>/rt_<agentRunID>.jsonl"; pass it to PutGlobalFile.
func TracePath(sessionID, agentRunID string) (string, error) {
	return sessionFile(sessionID, agentRunID, traceFilePrefix)
}

// GatewayRecordPath returns the run-global relative path of the
// executor-owned record of a run's model exchanges, next to its trace:
// "traces/<session>/gw_<runID>.jsonl".
func GatewayRecordPath(sessionID, runID string) (string, error) {
	return sessionFile(sessionID, runID, gatewayFilePrefix)
}

// sessionFile is "traces/<session>/<prefix><runID>.jsonl".
func sessionFile(sessionID, runID, prefix string) (string, error) {
	if err := validateID("session", sessionID); err != nil {
		return "", err
	}
	if err := validateID("agent run", runID); err != nil {
		return "", err
	}
	return tracesDir + "/" + sessionID + "/" + prefix + runID + recordFileExt, nil
}
