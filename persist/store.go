package persist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// Supported URL schemes, in the order error messages list them. file and
// mem are built in; the others open through a driver registered with
// RegisterScheme (drivers may register schemes beyond these).
var supportedSchemes = []string{"file", "mem", "s3"}

// driverPackages names, for each supported scheme served by a driver, the
// package a program imports to register it.
var driverPackages = map[string]string{
	"s3": "github.com/taskrun/taskrun/persist/s3",
}

// Opener opens the bucket of a store URL for the scheme it was registered
// for. The URL is Open's, already parsed; the opener owns its query
// parameters.
type Opener func(ctx context.Context, u *url.URL) (Bucket, error)

var (
	driversMu sync.RWMutex
	drivers   = map[string]Opener{}
)

// RegisterScheme makes Open accept URLs of scheme, opened by open. A driver
// package calls it from its init function, so a program links only the
// drivers it imports (package persist/s3 registers s3://). It panics when
// scheme is built in or already registered.
func RegisterScheme(scheme string, open Opener) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if scheme == "file" || scheme == "mem" || drivers[scheme] != nil {
		panic(fmt.Sprintf("persist: store scheme %q registered twice", scheme))
	}
	drivers[scheme] = open
}

// driver is the opener registered for scheme, or nil.
func driver(scheme string) Opener {
	driversMu.RLock()
	defer driversMu.RUnlock()
	return drivers[scheme]
}

// droppedSchemes are schemes of gocloud drivers the store does not link,
// each with the way to reach that service instead. Those drivers cannot be
// tested against a real server here, and they brought a third of the
// binary's package initialisation to every start of the CLI.
var droppedSchemes = map[string]string{
	"gs":     "Google Cloud Storage serves the S3 API: use s3://BUCKET?endpoint=https://storage.googleapis.com with an HMAC key in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
	"azblob": "Azure Blob Storage has no S3-compatible API; put an S3-compatible gateway in front of it, or store to s3:// or file://",
}

// Store is a tenant-scoped blob store over a Bucket. It implements
// PersistStorage and ArtifactStorage and is safe for concurrent use.
type Store struct {
	bucket Bucket
	retry  retryPolicy
	locks  keyLocks
}

var (
	_ PersistStorage  = (*Store)(nil)
	_ ArtifactStorage = (*Store)(nil)
)

// Option adjusts a Store opened by Open.
type Option func(*Store)

// WithRetry sets how many times the store tries an operation whose failure
// looks transient (at least 1) and the delay before the first retry, which
// doubles for each further retry (capped at 2s, jittered). The default is 3
// attempts starting at 100ms. Cloud SDKs also retry single requests on their
// own; these attempts are for whole operations.
func WithRetry(attempts int, baseDelay time.Duration) Option {
	return func(s *Store) {
		s.retry.attempts = max(attempts, 1)
		s.retry.backoff.Initial = max(baseDelay, time.Millisecond)
	}
}

// Open opens the blob store at rawURL. Accepted schemes:
//
//   - file:///abs/dir or file://./rel/dir — a local directory. A relative
//     path (host ".") is resolved against the process working directory when
//     Open is called. The directory is created (mode 0700) if missing, and
//     temporary files are written next to their final path so the final
//     rename never crosses file systems. The parameters create_dir and
//     dir_file_mode may override these defaults (no_tmp_dir is accepted);
//     metadata=skip is refused because the store relies on object metadata.
//     The layout is gocloud fileblob's: each object at its key, its content
//     type and metadata in KEY.attrs.
//   - mem:// — in-process memory, for tests.
//   - s3://bucket?region=R&endpoint=http://host:port&use_path_style=true —
//     when the program imports package persist/s3 (its driver), Amazon S3 or
//     any S3-compatible server through gocloud's s3blob, with the
//     same URL parameters as s3blob's URL opener (also disable_https,
//     accelerate, ssetype, kmskeyid, profile, anonymous, ...). Credentials come
//     from the AWS SDK default chain (e.g. AWS_ACCESS_KEY_ID). The SDK's own
//     per-request retries are bounded to 3 attempts at most 250ms apart.
//
// gs:// and azblob:// are refused with the way to reach those services
// (Google Cloud Storage serves the S3 API).
//
// Open does no I/O against remote stores; use Ping to check reachability.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("persist: parse store URL: %w", err)
	}
	if how, ok := droppedSchemes[u.Scheme]; ok {
		return nil, fmt.Errorf("persist: %s:// stores are not supported (use one of %s): %s",
			u.Scheme, strings.Join(schemeList(), ", "), how)
	}
	if !isSupportedScheme(u.Scheme) && driver(u.Scheme) == nil {
		return nil, fmt.Errorf("persist: unsupported store URL scheme %q in %q: use one of %s",
			u.Scheme, u.Redacted(), strings.Join(schemeList(), ", "))
	}
	var bucket Bucket
	switch u.Scheme {
	case "file":
		var fb *fileBucket
		if fb, err = openFileBucket(u); err == nil {
			bucket = fb
		}
	case "mem":
		bucket = NewMemBucket()
	default:
		open := driver(u.Scheme)
		if open == nil {
			return nil, fmt.Errorf("persist: %s:// stores need their driver, which this program does not link: import _ %q",
				u.Scheme, driverPackages[u.Scheme])
		}
		bucket, err = open(ctx, u)
	}
	if err != nil {
		return nil, fmt.Errorf("persist: open store %s://%s: %w", u.Scheme, u.Host+u.Path, err)
	}
	s := &Store{bucket: bucket, retry: defaultRetry}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

func isSupportedScheme(scheme string) bool {
	for _, s := range supportedSchemes {
		if s == scheme {
			return true
		}
	}
	return false
}

func schemeList() []string {
	out := make([]string, len(supportedSchemes))
	for i, s := range supportedSchemes {
		out[i] = s + "://"
	}
	return out
}

// Close releases the store's resources.
func (s *Store) Close() error {
	return s.bucket.Close()
}

// Ping checks that the store is reachable and its bucket exists. A transient
// failure wraps ErrStoreUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	return s.do(ctx, "ping", "bucket", func(ctx context.Context) error {
		ok, err := s.bucket.IsAccessible(ctx)
		if err == nil && !ok {
			return errors.New("bucket does not exist or is not accessible: create it or fix the store URL")
		}
		return err
	})
}

// PutRunFile streams r to the run file name (one path element, e.g.
// "output.log"). See Store.put for streaming, digest and retry behaviour.
func (s *Store) PutRunFile(ctx context.Context, ref RunRef, name string, r io.Reader, contentType string) (ObjectInfo, error) {
	k, err := runKey(ref, name)
	if err != nil {
		return ObjectInfo{}, err
	}
	return s.put(ctx, k, r, contentType)
}

// OpenRunFile opens a run file for reading; a missing one wraps ErrNotFound.
func (s *Store) OpenRunFile(ctx context.Context, ref RunRef, name string) (io.ReadCloser, error) {
	k, err := runKey(ref, name)
	if err != nil {
		return nil, err
	}
	return s.open(ctx, k.String())
}

// PutGlobalFile streams r to relPath in the tenant's run-global storage.
func (s *Store) PutGlobalFile(ctx context.Context, userID, relPath string, r io.Reader, contentType string) (ObjectInfo, error) {
	k, err := globalKey(userID, relPath)
	if err != nil {
		return ObjectInfo{}, err
	}
	return s.put(ctx, k, r, contentType)
}

// OpenGlobalFile opens a run-global file; a missing one wraps ErrNotFound.
func (s *Store) OpenGlobalFile(ctx context.Context, userID, relPath string) (io.ReadCloser, error) {
	k, err := globalKey(userID, relPath)
	if err != nil {
		return nil, err
	}
	return s.open(ctx, k.String())
}

// PutArtifact streams r to the run's artifact relPath.
func (s *Store) PutArtifact(ctx context.Context, ref RunRef, relPath string, r io.Reader, contentType string) (ObjectInfo, error) {
	k, err := artifactKey(ref, relPath)
	if err != nil {
		return ObjectInfo{}, err
	}
	return s.put(ctx, k, r, contentType)
}

// OpenArtifact opens a stored artifact; a missing one wraps ErrNotFound.
func (s *Store) OpenArtifact(ctx context.Context, ref RunRef, relPath string) (io.ReadCloser, error) {
	k, err := artifactKey(ref, relPath)
	if err != nil {
		return nil, err
	}
	return s.open(ctx, k.String())
}

// open opens key for reading, retrying transient failures.
func (s *Store) open(ctx context.Context, key string) (io.ReadCloser, error) {
	var r io.ReadCloser
	err := s.do(ctx, "open", key, func(ctx context.Context) error {
		var err error
		r, err = s.bucket.NewReader(ctx, key)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Open opens the object at key (as returned by RunKey, ArtifactKey or
// GlobalKey, or listed in a run's stored objects) for reading.
func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	if _, err := parseKey(key); err != nil {
		return nil, err
	}
	return s.open(ctx, key)
}

// Stat describes the object at key (as returned by RunKey, ArtifactKey or
// GlobalKey). SHA256 is empty only when the digest of a streamed upload
// cannot be confirmed, e.g. while another writer is replacing the object.
func (s *Store) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := parseKey(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	var attrs Attributes
	err = s.do(ctx, "stat", key, func(ctx context.Context) error {
		var err error
		attrs, err = s.bucket.Attributes(ctx, key)
		return err
	})
	if err != nil {
		return ObjectInfo{}, err
	}
	info := ObjectInfo{Key: key, Size: attrs.Size, ContentType: attrs.ContentType, SHA256: attrs.Metadata[metaSHA256]}
	if info.SHA256 == "" && attrs.Metadata[metaDigestID] != "" {
		info.SHA256, err = s.recordedDigest(ctx, k, attrs.Metadata[metaDigestID])
		if err != nil {
			return ObjectInfo{}, err
		}
	}
	return info, nil
}

// List returns the sorted keys under prefix, e.g. RunPrefix(ref) or
// TenantPrefix(user). Listing a whole tenant includes its digest records
// under "tenants/<user>/digests/".
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	err := s.do(ctx, "list", prefix, func(ctx context.Context) error {
		keys = keys[:0]
		objs, err := s.bucket.List(ctx, prefix, "")
		for _, obj := range objs {
			keys = append(keys, obj.Key)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(keys)
	return keys, nil
}

// keyLocks serialises writes to the same key within this process, so an
// object and its metadata (and digest record) always come from one writer.
// Some drivers (fileblob) write metadata and data in two steps.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	refs int
}

// lock locks key and returns its unlock function.
func (l *keyLocks) lock(key string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*keyLock)
	}
	kl := l.m[key]
	if kl == nil {
		kl = &keyLock{}
		l.m[key] = kl
	}
	kl.refs++
	l.mu.Unlock()

	kl.Lock()
	return func() {
		kl.Unlock()
		l.mu.Lock()
		if kl.refs--; kl.refs == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}
