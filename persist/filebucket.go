package persist

// The file:// bucket keeps each object as a file under its directory, at
// the object's key (escaped as fileescape.go says), and its content type and metadata beside it in
// KEY.attrs (JSON): the layout gocloud's fileblob used, so a store written
// by either is read by the other. A write goes to KEY.<hex time>.tmp and is
// renamed over KEY on commit, so readers never see a partial object.

import (
	"context"
	"crypto/md5" //nolint:gosec // the md5 field of an .attrs file, as fileblob wrote it; not a security check
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// attrsExt ends the name of an object's attributes file; no key may end in it.
const attrsExt = ".attrs"

// errInvalidKey marks a key the file bucket cannot store.
var errInvalidKey = errors.New("invalid key")

// fileAttrs is the JSON of an .attrs file.
type fileAttrs struct {
	CacheControl       string            `json:"user.cache_control"`
	ContentDisposition string            `json:"user.content_disposition"`
	ContentEncoding    string            `json:"user.content_encoding"`
	ContentLanguage    string            `json:"user.content_language"`
	ContentType        string            `json:"user.content_type"`
	Metadata           map[string]string `json:"user.metadata"`
	MD5                []byte            `json:"md5"`
}

// fileBucket is a Bucket in a local directory.
type fileBucket struct {
	dir     string      // absolute
	dirMode os.FileMode // of the directories it creates
}

// fileParams are the query parameters a file:// URL may carry.
var fileParams = map[string]bool{"create_dir": true, "dir_file_mode": true, "no_tmp_dir": true, "metadata": true}

// openFileBucket opens the file:// URL u: file:///abs/dir or
// file://./rel/dir. create_dir (default true) creates the directory,
// dir_file_mode (default 0700) is the mode of the directories it creates;
// temporary files are always written next to their final path
// (no_tmp_dir), and metadata=skip is refused: the store keeps the content
// type and SHA-256 in metadata.
func openFileBucket(u *url.URL) (*fileBucket, error) {
	if u.Host != "" && u.Host != "." && u.Host != "localhost" {
		return nil, fmt.Errorf("persist: file store URL %q has host %q: use file:///abs/dir or file://./rel/dir", u.Redacted(), u.Host)
	}
	if strings.Trim(u.Path, "/") == "" {
		return nil, fmt.Errorf("persist: file store URL %q names no directory: use file:///abs/dir or file://./rel/dir", u.Redacted())
	}
	q := u.Query()
	for k := range q {
		if !fileParams[k] {
			return nil, fmt.Errorf("persist: file store URL %q: unknown parameter %q (known: create_dir, dir_file_mode, no_tmp_dir)", u.Redacted(), k)
		}
	}
	if q.Get("metadata") != "" {
		return nil, fmt.Errorf("persist: file store URL %q sets metadata=%s: drop it, the store keeps content type and SHA-256 in metadata", u.Redacted(), q.Get("metadata"))
	}
	b := &fileBucket{dirMode: 0o700}
	if s := q.Get("dir_file_mode"); s != "" {
		m, err := strconv.ParseUint(s, 0, 32)
		if err != nil {
			return nil, fmt.Errorf("persist: file store URL %q: dir_file_mode %q: %w", u.Redacted(), s, err)
		}
		b.dirMode = os.FileMode(m)
	}
	path := u.Path
	if u.Host == "." {
		path = strings.TrimPrefix(path, "/")
	}
	dir, err := filepath.Abs(filepath.FromSlash(path))
	if err != nil {
		return nil, fmt.Errorf("persist: file store %s: %w", path, err)
	}
	b.dir = dir
	if create := q.Get("create_dir"); create == "" || create == "true" || create == "1" {
		if err := os.MkdirAll(dir, b.dirMode); err != nil {
			return nil, fmt.Errorf("persist: create file store directory: %w", err)
		}
	}
	info, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("persist: file store %s is not a directory", dir)
	}
	return b, nil
}

// path is the file of key (escapeKey). A key that would leave the
// directory or end in .attrs is refused.
func (b *fileBucket) path(key string) (string, error) {
	p := filepath.Join(b.dir, filepath.FromSlash(escapeKey(key)))
	if strings.HasSuffix(p, attrsExt) {
		return "", fmt.Errorf("%w %q: the %s extension is reserved", errInvalidKey, key, attrsExt)
	}
	if !strings.HasPrefix(p, b.dir+string(filepath.Separator)) {
		return "", fmt.Errorf("%w %q: it leaves the store's directory", errInvalidKey, key)
	}
	return p, nil
}

// NewWriter implements Bucket.
func (b *fileBucket) NewWriter(ctx context.Context, key string, opts WriterOptions) (io.WriteCloser, error) {
	path, err := b.path(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), b.dirMode); err != nil {
		return nil, err
	}
	f, err := createTemp(path)
	if err != nil {
		return nil, err
	}
	var md map[string]string
	if len(opts.Metadata) > 0 {
		md = opts.Metadata
	}
	return &fileWriter{ctx: ctx, f: f, path: path, md5: md5.New(), //nolint:gosec // see the import
		attrs: fileAttrs{ContentType: opts.ContentType, Metadata: md}}, nil
}

// createTemp creates path.<hex time>.tmp, mode 0666 less the umask.
func createTemp(path string) (*os.File, error) {
	for try := 0; ; try++ {
		name := path + "." + strconv.FormatInt(time.Now().UnixNano(), 16) + ".tmp"
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) && try < 10000 {
			continue
		}
		return f, err
	}
}

// fileWriter writes one object of a fileBucket.
type fileWriter struct {
	ctx   context.Context
	f     *os.File
	path  string
	attrs fileAttrs
	md5   hash.Hash
}

func (w *fileWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.md5.Write(p[:n])
	return n, err
}

// Close commits the object: its attributes, then the data renamed into
// place. A done ctx commits nothing.
func (w *fileWriter) Close() error {
	if err := w.f.Close(); err != nil {
		_ = os.Remove(w.f.Name())
		return err
	}
	defer func() { _ = os.Remove(w.f.Name()) }() // gone already once renamed
	if err := w.ctx.Err(); err != nil {
		return err
	}
	w.attrs.MD5 = w.md5.Sum(nil)
	if err := writeAttrs(w.path, w.attrs); err != nil {
		return err
	}
	if err := os.Rename(w.f.Name(), w.path); err != nil {
		_ = os.Remove(w.path + attrsExt)
		return err
	}
	return nil
}

// writeAttrs writes path's .attrs file.
func writeAttrs(path string, a fileAttrs) error {
	f, err := os.Create(path + attrsExt)
	if err != nil {
		return err
	}
	if err := json.NewEncoder(f).Encode(a); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return err
	}
	return f.Close()
}

// readAttrs reads path's .attrs file; an object without one is
// application/octet-stream with no metadata.
func readAttrs(path string) (fileAttrs, error) {
	data, err := os.ReadFile(path + attrsExt)
	if errors.Is(err, fs.ErrNotExist) {
		return fileAttrs{ContentType: defaultContentType}, nil
	}
	if err != nil {
		return fileAttrs{}, err
	}
	var a fileAttrs
	if err := json.Unmarshal(data, &a); err != nil {
		return fileAttrs{}, fmt.Errorf("persist: %s%s: %w", path, attrsExt, err)
	}
	return a, nil
}

// object is the file of key, which must be a regular file.
func (b *fileBucket) object(key string) (string, os.FileInfo, error) {
	path, err := b.path(key)
	if err != nil {
		return "", nil, err
	}
	info, err := os.Stat(path)
	if err != nil {
		return "", nil, err
	}
	if info.IsDir() {
		return "", nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist}
	}
	return path, info, nil
}

// NewReader implements Bucket.
func (b *fileBucket) NewReader(_ context.Context, key string) (io.ReadCloser, error) {
	path, _, err := b.object(key)
	if err != nil {
		return nil, err
	}
	return os.Open(path)
}

// Attributes implements Bucket.
func (b *fileBucket) Attributes(_ context.Context, key string) (Attributes, error) {
	path, info, err := b.object(key)
	if err != nil {
		return Attributes{}, err
	}
	a, err := readAttrs(path)
	if err != nil {
		return Attributes{}, err
	}
	return Attributes{Size: info.Size(), ContentType: a.ContentType, Metadata: a.Metadata}, nil
}

// List implements Bucket: a walk of the directory below prefix's last
// "/", without the .attrs files.
func (b *fileBucket) List(_ context.Context, prefix, delimiter string) ([]ListObject, error) {
	root := b.dir
	if i := strings.LastIndex(prefix, "/"); i > -1 {
		root = filepath.Join(root, filepath.FromSlash(prefix[:i]))
	}
	if root != b.dir && !strings.HasPrefix(root, b.dir+string(filepath.Separator)) {
		return nil, fmt.Errorf("%w: prefix %q leaves the store's directory", errInvalidKey, prefix)
	}
	var out []ListObject
	dirs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == b.dir || strings.HasSuffix(path, attrsExt) {
			return nil //nolint:nilerr // an unreadable entry is skipped, as fileblob did
		}
		key := unescapeKey(filepath.ToSlash(path[len(b.dir)+1:]))
		if d.IsDir() {
			if k := key + "/"; len(k) > len(prefix) && !strings.HasPrefix(k, prefix) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		if delimiter != "" {
			if i := strings.Index(key[len(prefix):], delimiter); i >= 0 {
				dir := prefix + key[len(prefix):][:i+len(delimiter)]
				if !dirs[dir] {
					dirs[dir] = true
					out = append(out, ListObject{Key: dir, IsDir: true})
				}
				return nil
			}
		}
		out = append(out, ListObject{Key: key})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// IsAccessible implements Bucket.
func (b *fileBucket) IsAccessible(context.Context) (bool, error) {
	info, err := os.Stat(b.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return info.IsDir(), nil
}

// ErrorCode implements Bucket: a missing file is CodeNotFound, a refused
// key CodeInvalidArgument, anything else CodeUnknown (the store's own
// errno checks tell a key in another's way).
func (b *fileBucket) ErrorCode(err error) ErrorCode {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return CodeNotFound
	case errors.Is(err, errInvalidKey):
		return CodeInvalidArgument
	default:
		return CodeUnknown
	}
}

// Close implements Bucket.
func (b *fileBucket) Close() error { return nil }
