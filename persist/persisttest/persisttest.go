// Package persisttest is a conformance suite for persist.Store backends, in
// the style of gocloud's drivertest: every backend URL the executor supports
// runs the same checks.
package persisttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/persist"
)

// LargeSize is the size of the streamed object the suite round-trips.
const LargeSize = 50 << 20

// RunConformance runs every conformance check. open returns a fresh Store for
// one subtest and arranges its Close; stores returned by separate calls may
// share a bucket, because every subtest uses tenant IDs of its own.
func RunConformance(t *testing.T, open func(t *testing.T) *persist.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *persist.Store)
	}{
		{"RunFileRoundTrip", testRunFileRoundTrip},
		{"ArtifactAndGlobalRoundTrip", testArtifactAndGlobalRoundTrip},
		{"KeyLayout", testKeyLayout},
		{"DefaultContentType", testDefaultContentType},
		{"ReaderOffset", testReaderOffset},
		{"LargeStreamed", testLargeStreamed},
		{"LargeFile", testLargeFile},
		{"Overwrite", testOverwrite},
		{"MissingObject", testMissingObject},
		{"BadNamesRejected", testBadNamesRejected},
		{"EdgeNamesRoundTrip", testEdgeNamesRoundTrip},
		{"TenantIsolation", testTenantIsolation},
		{"ConcurrentPuts", testConcurrentPuts},
		{"SourceChangedAborts", testSourceChangedAborts},
		{"SourceReadErrorAborts", testSourceReadErrorAborts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open(t))
		})
	}
}

// newRef returns a run reference in a tenant no other subtest uses.
func newRef() persist.RunRef {
	return persist.RunRef{
		UserID:         fmt.Sprintf("user-%016x", rand.Uint64()),
		ConversationID: "conv_1",
		TaskID:         "task-1",
		RunID:          "run-1",
	}
}

// streamOnly hides any Seek method, so the store must treat r as a one-pass
// stream.
type streamOnly struct{ io.Reader }

// sources returns the two ways a caller can pass content: re-readable and
// one-pass.
func sources() map[string]func([]byte) io.Reader {
	return map[string]func([]byte) io.Reader{
		"seekable": func(b []byte) io.Reader { return bytes.NewReader(b) },
		"streamed": func(b []byte) io.Reader { return streamOnly{bytes.NewReader(b)} },
	}
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// readAll reads and closes rc.
func readAll(t *testing.T, rc io.ReadCloser, err error) []byte {
	t.Helper()
	require.NoError(t, err)
	defer func() { require.NoError(t, rc.Close()) }()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}

// hashAll streams rc into SHA-256 and closes it.
func hashAll(t *testing.T, rc io.ReadCloser, err error) (string, int64) {
	t.Helper()
	require.NoError(t, err)
	defer func() { require.NoError(t, rc.Close()) }()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil)), n
}

// requireStat checks the store's description of key against content.
func requireStat(t *testing.T, s *persist.Store, key string, content []byte, contentType string) {
	t.Helper()
	info, err := s.Stat(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, persist.ObjectInfo{Key: key, Size: int64(len(content)), SHA256: sum(content), ContentType: contentType}, info)
}

func testRunFileRoundTrip(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	for mode, src := range sources() {
		t.Run(mode, func(t *testing.T) {
			ref := newRef()
			content := []byte("line 1\nline 2 (" + mode + ")\n")
			info, err := s.PutRunFile(ctx, ref, "output.log", src(content), "text/plain; charset=utf-8")
			require.NoError(t, err)
			key, err := persist.RunKey(ref, "output.log")
			require.NoError(t, err)
			assert.Equal(t, persist.ObjectInfo{Key: key, Size: int64(len(content)), SHA256: sum(content), ContentType: "text/plain; charset=utf-8"}, info)

			rc, err := s.OpenRunFile(ctx, ref, "output.log")
			assert.Equal(t, content, readAll(t, rc, err))
			requireStat(t, s, key, content, "text/plain; charset=utf-8")
		})
	}
}

func testArtifactAndGlobalRoundTrip(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	for mode, src := range sources() {
		t.Run(mode, func(t *testing.T) {
			ref := newRef()
			report := []byte(`{"ok":true}`)
			info, err := s.PutArtifact(ctx, ref, "reports/summary.json", src(report), "application/json")
			require.NoError(t, err)
			rc, err := s.OpenArtifact(ctx, ref, "reports/summary.json")
			assert.Equal(t, report, readAll(t, rc, err))
			requireStat(t, s, info.Key, report, "application/json")

			empty, err := s.PutArtifact(ctx, ref, "empty.txt", src(nil), "text/plain")
			require.NoError(t, err)
			assert.Equal(t, sum(nil), empty.SHA256)
			rc, err = s.OpenArtifact(ctx, ref, "empty.txt")
			assert.Empty(t, readAll(t, rc, err))
			requireStat(t, s, empty.Key, nil, "text/plain")

			trace, err := persist.TracePath("sess-1", "agent_7")
			require.NoError(t, err)
			lines := []byte("{\"event\":\"start\"}\n{\"event\":\"end\"}\n")
			ginfo, err := s.PutGlobalFile(ctx, ref.UserID, trace, src(lines), "application/x-ndjson")
			require.NoError(t, err)
			rc, err = s.OpenGlobalFile(ctx, ref.UserID, trace)
			assert.Equal(t, lines, readAll(t, rc, err))
			requireStat(t, s, ginfo.Key, lines, "application/x-ndjson")
		})
	}
}

func testKeyLayout(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	u := ref.UserID
	run, err := s.PutRunFile(ctx, ref, "audit.json", strings.NewReader("{}"), "application/json")
	require.NoError(t, err)
	art, err := s.PutArtifact(ctx, ref, "out/a.txt", strings.NewReader("a"), "text/plain")
	require.NoError(t, err)
	trace, err := persist.TracePath("s1", "r1")
	require.NoError(t, err)
	glob, err := s.PutGlobalFile(ctx, u, trace, strings.NewReader("{}\n"), "application/x-ndjson")
	require.NoError(t, err)

	runPrefix := "tenants/" + u + "/conversations/conv_1/tasks/task-1/runs/run-1/"
	assert.Equal(t, runPrefix+"audit.json", run.Key)
	assert.Equal(t, runPrefix+"artifacts/out/a.txt", art.Key)
	assert.Equal(t, "traces/s1/rt_r1.jsonl", trace)
	assert.Equal(t, "tenants/"+u+"/global/traces/s1/rt_r1.jsonl", glob.Key)

	gotPrefix, err := persist.RunPrefix(ref)
	require.NoError(t, err)
	assert.Equal(t, runPrefix, gotPrefix)
	keys, err := s.List(ctx, runPrefix)
	require.NoError(t, err)
	assert.Equal(t, []string{runPrefix + "artifacts/out/a.txt", runPrefix + "audit.json"}, keys)

	tenant, err := persist.TenantPrefix(u)
	require.NoError(t, err)
	keys, err = s.List(ctx, tenant)
	require.NoError(t, err)
	assert.Equal(t, []string{runPrefix + "artifacts/out/a.txt", runPrefix + "audit.json", glob.Key}, keys)
}

func testDefaultContentType(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	info, err := s.PutRunFile(ctx, ref, "state.bin", bytes.NewReader([]byte{0, 1, 2}), "")
	require.NoError(t, err)
	assert.Equal(t, "application/octet-stream", info.ContentType)
	requireStat(t, s, info.Key, []byte{0, 1, 2}, "application/octet-stream")
}

func testReaderOffset(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	r := bytes.NewReader([]byte("skip:keep"))
	_, err := r.Seek(5, io.SeekStart)
	require.NoError(t, err)
	info, err := s.PutRunFile(ctx, ref, "tail.txt", r, "text/plain")
	require.NoError(t, err)
	rc, err := s.OpenRunFile(ctx, ref, "tail.txt")
	assert.Equal(t, []byte("keep"), readAll(t, rc, err))
	requireStat(t, s, info.Key, []byte("keep"), "text/plain")
}

// genReader yields n deterministic pseudo-random bytes without holding them.
type genReader struct {
	rng  *rand.ChaCha8
	left int64
}

func newGen(seed byte, n int64) *genReader {
	var s [32]byte
	s[0] = seed
	return &genReader{rng: rand.NewChaCha8(s), left: n}
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), g.left)]
	n, _ := g.rng.Read(p)
	g.left -= int64(n)
	return n, nil
}

// genSum hashes the generator's output directly, without the store.
func genSum(t *testing.T, seed byte, n int64) string {
	t.Helper()
	h := sha256.New()
	_, err := io.Copy(h, newGen(seed, n))
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

func testLargeStreamed(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	want := genSum(t, 1, LargeSize)
	info, err := s.PutArtifact(ctx, ref, "big/blob.bin", streamOnly{newGen(1, LargeSize)}, "application/octet-stream")
	require.NoError(t, err)
	assert.Equal(t, int64(LargeSize), info.Size)
	assert.Equal(t, want, info.SHA256)

	rc, err := s.OpenArtifact(ctx, ref, "big/blob.bin")
	got, n := hashAll(t, rc, err)
	assert.Equal(t, int64(LargeSize), n)
	assert.Equal(t, want, got, "bytes read back differ from bytes sent")
	st, err := s.Stat(ctx, info.Key)
	require.NoError(t, err)
	assert.Equal(t, want, st.SHA256)
}

func testLargeFile(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	const size = 12 << 20
	path := filepath.Join(t.TempDir(), "session.tar")
	f, err := os.Create(path)
	require.NoError(t, err)
	_, err = io.Copy(f, newGen(2, size))
	require.NoError(t, err)
	_, err = f.Seek(0, io.SeekStart)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()

	want := genSum(t, 2, size)
	info, err := s.PutRunFile(ctx, ref, "session.tar", f, "application/x-tar")
	require.NoError(t, err)
	assert.Equal(t, want, info.SHA256)
	rc, err := s.OpenRunFile(ctx, ref, "session.tar")
	got, n := hashAll(t, rc, err)
	assert.Equal(t, int64(size), n)
	assert.Equal(t, want, got)
	requireStatSum(t, s, info.Key, want, size)
}

func requireStatSum(t *testing.T, s *persist.Store, key, want string, size int64) {
	t.Helper()
	st, err := s.Stat(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, want, st.SHA256)
	assert.Equal(t, size, st.Size)
}

func testOverwrite(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	srcs := sources()
	steps := []struct {
		mode    string
		content string
	}{
		{"seekable", "version one"},
		{"streamed", "version two, longer"},
		{"seekable", "v3"},
		{"streamed", "version four"},
		{"streamed", "version five"},
	}
	for i, step := range steps {
		content := []byte(step.content)
		info, err := s.PutArtifact(ctx, ref, "result.txt", srcs[step.mode](content), fmt.Sprintf("text/v%d", i))
		require.NoError(t, err, "step %d", i)
		rc, err := s.OpenArtifact(ctx, ref, "result.txt")
		assert.Equal(t, content, readAll(t, rc, err), "step %d", i)
		requireStat(t, s, info.Key, content, fmt.Sprintf("text/v%d", i))
	}
}

func testMissingObject(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	_, err := s.OpenRunFile(ctx, ref, "output.log")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	_, err = s.OpenArtifact(ctx, ref, "a/b.txt")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	_, err = s.OpenGlobalFile(ctx, ref.UserID, "traces/s/rt_x.jsonl")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	key, err := persist.RunKey(ref, "output.log")
	require.NoError(t, err)
	_, err = s.Stat(ctx, key)
	assert.ErrorIs(t, err, persist.ErrNotFound)
	assert.NotErrorIs(t, err, persist.ErrStoreUnavailable)
}

// untouchable fails the test if the store reads it: bad names must be
// refused before any I/O.
type untouchable struct{ t *testing.T }

func (u untouchable) Read([]byte) (int, error) {
	u.t.Error("store read the upload source of a rejected request")
	return 0, io.EOF
}

// badRelPaths are relative paths every method must refuse.
var badRelPaths = []string{
	"", ".", "..", "../x", "a/../b", "a/..", "/abs", "a//b", "a/./b", "a/", `a\b`, `..\x`,
	"a\x00b", "a\nb", strings.Repeat("a", 769),
	// Names an agent can give a file that no store may take: invalid UTF-8,
	// C1 controls, bidirectional overrides, the file driver's reserved
	// suffix, an element longer than any filesystem name.
	"bad\xff.txt", "a\u0085b", "a\u009bb", "invoice\u202Efdp.exe", "x\u2066y", "a\u200fb",
	"notes.attrs", "d.attrs/x", strings.Repeat("e", 201), "dir/" + strings.Repeat("e", 201) + "/f",
}

// edgeRelPaths are the most awkward relative paths a store must accept and
// give back byte for byte.
var edgeRelPaths = []string{
	strings.Repeat("e", 200),
	strings.Repeat(strings.Repeat("d", 200)+"/", 3) + strings.Repeat("f", 165),
	"__0x41__/__0x2f__.txt",
	"sp ace/naïve café ✓ 日本.md",
	"x.attrs.txt", ".hidden", "a.tmp", "-dash", "attrs",
}

// badIDs are IDs every method must refuse.
var badIDs = []string{"", ".", "..", "a/b", "a b", "a.b", "ü", strings.Repeat("x", 129), "a\x00"}

func testBadNamesRejected(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	good := newRef()
	src := untouchable{t}
	check := func(label string, err error) {
		t.Helper()
		assert.ErrorIs(t, err, persist.ErrInvalidName, label)
		assert.NotErrorIs(t, err, persist.ErrNotFound, label)
	}
	for _, p := range badRelPaths {
		_, err := s.PutArtifact(ctx, good, p, src, "")
		check("PutArtifact "+p, err)
		_, err = s.OpenArtifact(ctx, good, p)
		check("OpenArtifact "+p, err)
		_, err = s.PutGlobalFile(ctx, good.UserID, p, src, "")
		check("PutGlobalFile "+p, err)
		_, err = s.OpenGlobalFile(ctx, good.UserID, p)
		check("OpenGlobalFile "+p, err)
		_, err = s.PutRunFile(ctx, good, p, src, "")
		check("PutRunFile "+p, err)
	}
	for _, name := range []string{"artifacts", "artifacts/report.md"} {
		_, err := s.PutRunFile(ctx, good, name, src, "")
		check("PutRunFile "+name, err)
		_, err = s.OpenRunFile(ctx, good, name)
		check("OpenRunFile "+name, err)
	}
	for _, id := range badIDs {
		for _, ref := range []persist.RunRef{
			{UserID: id, ConversationID: "c", TaskID: "t", RunID: "r"},
			{UserID: good.UserID, ConversationID: id, TaskID: "t", RunID: "r"},
			{UserID: good.UserID, ConversationID: "c", TaskID: id, RunID: "r"},
			{UserID: good.UserID, ConversationID: "c", TaskID: "t", RunID: id},
		} {
			_, err := s.PutRunFile(ctx, ref, "output.log", src, "")
			check(fmt.Sprintf("PutRunFile %+v", ref), err)
			_, err = s.OpenRunFile(ctx, ref, "output.log")
			check(fmt.Sprintf("OpenRunFile %+v", ref), err)
			_, err = s.PutArtifact(ctx, ref, "a.txt", src, "")
			check(fmt.Sprintf("PutArtifact %+v", ref), err)
		}
		_, err := s.PutGlobalFile(ctx, id, "x.txt", src, "")
		check("PutGlobalFile user "+id, err)
		_, err = s.OpenGlobalFile(ctx, id, "x.txt")
		check("OpenGlobalFile user "+id, err)
		_, err = persist.TracePath(id, "r")
		check("TracePath session "+id, err)
	}
	for _, key := range []string{"", "x", "tenants/" + good.UserID, "other/" + good.UserID + "/global/x",
		"tenants/../global/x", "tenants/" + good.UserID + "/../u2/global/x"} {
		_, err := s.Stat(ctx, key)
		check("Stat "+key, err)
	}
	tenant, err := persist.TenantPrefix(good.UserID)
	require.NoError(t, err)
	keys, err := s.List(ctx, tenant)
	require.NoError(t, err)
	assert.Empty(t, keys, "rejected requests stored something")
}

// testEdgeNamesRoundTrip stores a file under each edge name in each
// namespace an agent-chosen name reaches and reads it back: a name
// ValidateRelPath accepts is one every backend can hold.
func testEdgeNamesRoundTrip(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	for _, p := range edgeRelPaths {
		require.NoError(t, persist.ValidateRelPath(p), p)
		body := "content of " + p
		_, err := s.PutArtifact(ctx, ref, p, strings.NewReader(body), "")
		require.NoError(t, err, "PutArtifact %q", p)
		_, err = s.PutGlobalFile(ctx, ref.UserID, p, strings.NewReader(body), "")
		require.NoError(t, err, "PutGlobalFile %q", p)
		rc, err := s.OpenArtifact(ctx, ref, p)
		require.NoError(t, err, "OpenArtifact %q", p)
		got, err := io.ReadAll(rc)
		rc.Close()
		require.NoError(t, err)
		assert.Equal(t, body, string(got), p)
		rc, err = s.OpenGlobalFile(ctx, ref.UserID, p)
		require.NoError(t, err, "OpenGlobalFile %q", p)
		got, err = io.ReadAll(rc)
		rc.Close()
		require.NoError(t, err)
		assert.Equal(t, body, string(got), p)
	}
	prefix, err := persist.TenantPrefix(ref.UserID)
	require.NoError(t, err)
	keys, err := s.List(ctx, prefix)
	require.NoError(t, err)
	for _, p := range edgeRelPaths {
		key, err := persist.GlobalKey(ref.UserID, p)
		require.NoError(t, err)
		assert.Contains(t, keys, key, "listing gives the key back as stored")
	}
}

func testTenantIsolation(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	a := newRef()
	b := a
	b.UserID = a.UserID + "x" // a's ID is a prefix of b's: listing must still separate them
	trace, err := persist.TracePath("sess", "one")
	require.NoError(t, err)
	_, err = s.PutGlobalFile(ctx, a.UserID, trace, strings.NewReader("secret of a\n"), "application/x-ndjson")
	require.NoError(t, err)
	_, err = s.PutRunFile(ctx, a, "output.log", strings.NewReader("a's output"), "text/plain")
	require.NoError(t, err)
	_, err = s.PutArtifact(ctx, a, "report.md", strings.NewReader("a's report"), "text/markdown")
	require.NoError(t, err)

	// Same IDs under another tenant address nothing.
	_, err = s.OpenGlobalFile(ctx, b.UserID, trace)
	assert.ErrorIs(t, err, persist.ErrNotFound)
	_, err = s.OpenRunFile(ctx, b, "output.log")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	_, err = s.OpenArtifact(ctx, b, "report.md")
	assert.ErrorIs(t, err, persist.ErrNotFound)

	// Relative paths cannot climb into another tenant.
	for _, p := range []string{
		"../../" + a.UserID + "/global/" + trace,
		"../../../../../../../" + a.UserID + "/conversations/conv_1/tasks/task-1/runs/run-1/output.log",
		"..%2f..%2f" + a.UserID + "/global/" + trace,
	} {
		_, err = s.OpenGlobalFile(ctx, b.UserID, p)
		if !assert.Error(t, err, p) {
			continue
		}
		assert.True(t, errors.Is(err, persist.ErrInvalidName) || errors.Is(err, persist.ErrNotFound), "%s: %v", p, err)
		_, err = s.OpenArtifact(ctx, b, p)
		assert.True(t, errors.Is(err, persist.ErrInvalidName) || errors.Is(err, persist.ErrNotFound), "%s: %v", p, err)
	}
	_, err = s.OpenGlobalFile(ctx, b.UserID+"/../"+a.UserID, trace)
	assert.ErrorIs(t, err, persist.ErrInvalidName)

	// Tenant listings do not overlap even when one ID prefixes another.
	_, err = s.PutGlobalFile(ctx, b.UserID, "notes.txt", strings.NewReader("b"), "text/plain")
	require.NoError(t, err)
	for _, tc := range []struct{ owner, other string }{{a.UserID, b.UserID}, {b.UserID, a.UserID}} {
		prefix, err := persist.TenantPrefix(tc.owner)
		require.NoError(t, err)
		keys, err := s.List(ctx, prefix)
		require.NoError(t, err)
		require.NotEmpty(t, keys)
		for _, k := range keys {
			assert.True(t, strings.HasPrefix(k, "tenants/"+tc.owner+"/"), "key %s listed for tenant %s", k, tc.owner)
		}
	}
}

func testConcurrentPuts(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	const n = 8
	contents := make([][]byte, n)
	for i := range contents {
		contents[i] = bytes.Repeat([]byte{byte('a' + i)}, 64<<10+i)
	}
	srcs := sources()
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	for i := range n {
		mode := "seekable"
		if i%2 == 1 {
			mode = "streamed"
		}
		wg.Go(func() {
			_, errs[i] = s.PutArtifact(ctx, ref, fmt.Sprintf("part-%d.bin", i), srcs[mode](contents[i]), "application/octet-stream")
		})
		wg.Go(func() {
			_, errs[n+i] = s.PutRunFile(ctx, ref, "shared.bin", srcs[mode](contents[i]), "application/octet-stream")
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "put %d", i)
	}
	for i := range n {
		rc, err := s.OpenArtifact(ctx, ref, fmt.Sprintf("part-%d.bin", i))
		assert.Equal(t, contents[i], readAll(t, rc, err), "part %d", i)
	}
	rc, err := s.OpenRunFile(ctx, ref, "shared.bin")
	got := readAll(t, rc, err)
	assert.Contains(t, contents, got, "shared key holds bytes no writer sent")
	key, err := persist.RunKey(ref, "shared.bin")
	require.NoError(t, err)
	requireStat(t, s, key, got, "application/octet-stream")
}

// flippingSource is a re-readable source whose bytes change after the first
// rewind, like a file rewritten while it is uploaded.
type flippingSource struct {
	data []byte
	pos  int64
}

func (f *flippingSource) Read(p []byte) (int, error) {
	if f.pos >= int64(len(f.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.data[f.pos:])
	f.pos += int64(n)
	return n, nil
}

func (f *flippingSource) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		f.pos += off
	case io.SeekStart:
		f.pos = off
		f.data[0] ^= 0xff
	default:
		return 0, errors.New("flippingSource: unsupported whence")
	}
	return f.pos, nil
}

func testSourceChangedAborts(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	v1 := []byte("committed version")
	_, err := s.PutRunFile(ctx, ref, "output.log", bytes.NewReader(v1), "text/plain")
	require.NoError(t, err)

	_, err = s.PutRunFile(ctx, ref, "output.log", &flippingSource{data: []byte("changing content")}, "text/plain")
	assert.ErrorIs(t, err, persist.ErrSourceChanged)
	assert.NotErrorIs(t, err, persist.ErrStoreUnavailable)

	rc, err := s.OpenRunFile(ctx, ref, "output.log")
	assert.Equal(t, v1, readAll(t, rc, err), "aborted upload replaced the object")
	key, err := persist.RunKey(ref, "output.log")
	require.NoError(t, err)
	requireStat(t, s, key, v1, "text/plain")
}

// failingSource yields some bytes, then fails.
type failingSource struct {
	left int
	err  error
}

func (f *failingSource) Read(p []byte) (int, error) {
	if f.left == 0 {
		return 0, f.err
	}
	n := min(len(p), f.left)
	clear(p[:n])
	f.left -= n
	return n, nil
}

func testSourceReadErrorAborts(t *testing.T, s *persist.Store) {
	ctx := context.Background()
	ref := newRef()
	errDisk := errors.New("disk read failed")
	v1 := []byte("good artifact")
	_, err := s.PutArtifact(ctx, ref, "out.bin", streamOnly{bytes.NewReader(v1)}, "application/octet-stream")
	require.NoError(t, err)

	_, err = s.PutArtifact(ctx, ref, "out.bin", &failingSource{left: 1 << 20, err: errDisk}, "application/octet-stream")
	assert.ErrorIs(t, err, errDisk)
	assert.NotErrorIs(t, err, persist.ErrStoreUnavailable)
	rc, err := s.OpenArtifact(ctx, ref, "out.bin")
	assert.Equal(t, v1, readAll(t, rc, err), "failed upload replaced the object")
	key, err := persist.ArtifactKey(ref, "out.bin")
	require.NoError(t, err)
	requireStat(t, s, key, v1, "application/octet-stream")

	_, err = s.PutArtifact(ctx, ref, "never.bin", &failingSource{left: 10, err: errDisk}, "application/octet-stream")
	assert.ErrorIs(t, err, errDisk)
	_, err = s.OpenArtifact(ctx, ref, "never.bin")
	assert.ErrorIs(t, err, persist.ErrNotFound, "failed upload left an object behind")
}
