package checkpoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/checkpoint"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
)

func openStore(t *testing.T) *persist.Store {
	t.Helper()
	st, err := persist.Open(context.Background(), "file://"+t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func checkpointDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("the sandbox's memory"), 0o600))
	return dir
}

var (
	alice = model.RunRef{UserID: "alice", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
	bob   = model.RunRef{UserID: "bob", ConversationID: "c1", TaskID: "t1", RunID: "r1"}
)

func TestSaveLoadUnderTheTenantsPrefix(t *testing.T) {
	st := openStore(t)
	m, err := checkpoint.Save(t.Context(), st, alice, checkpointDir(t), manifest())
	require.NoError(t, err)
	require.Equal(t, "alice", m.Tenant)
	require.Equal(t, "r1", m.Run)

	// The manifest copy is stored next to the archive.
	r, err := st.OpenRunFile(t.Context(), alice, checkpoint.ManifestObject)
	require.NoError(t, err)
	var stored checkpoint.Manifest
	require.NoError(t, json.NewDecoder(r).Decode(&stored))
	require.NoError(t, r.Close())
	require.Equal(t, m.Digest, stored.Digest)

	dst := t.TempDir()
	got, err := checkpoint.Load(t.Context(), st, alice, m, dst, t.TempDir(), 0)
	require.NoError(t, err)
	require.Equal(t, m.StdoutOffset, got.StdoutOffset)
	img, err := os.ReadFile(filepath.Join(dst, "checkpoint.img"))
	require.NoError(t, err)
	require.Equal(t, "the sandbox's memory", string(img))

	// Bob's run of the same IDs has no checkpoint: it is under alice's prefix.
	_, err = checkpoint.Load(t.Context(), st, bob, manifestOf(m, bob), t.TempDir(), t.TempDir(), 0)
	require.ErrorIs(t, err, persist.ErrNotFound)
}

// manifestOf is m as the record of run ref would name it.
func manifestOf(m checkpoint.Manifest, ref model.RunRef) checkpoint.Manifest {
	m.Tenant, m.Run = ref.UserID, ref.RunID
	return m
}

func TestLoadRefusesACheckpointPlantedFromAnotherTenant(t *testing.T) {
	st := openStore(t)
	m, err := checkpoint.Save(t.Context(), st, alice, checkpointDir(t), manifest())
	require.NoError(t, err)
	copyObject(t, st, alice, bob, checkpoint.ArchiveObject)

	// Bob's record, had it been made to name alice's digest: the archive
	// still says it is alice's.
	dst := t.TempDir()
	_, err = checkpoint.Load(t.Context(), st, bob, manifestOf(m, bob), dst, t.TempDir(), 0)
	require.ErrorIs(t, err, checkpoint.ErrForeign)
	entries, err := os.ReadDir(dst)
	require.NoError(t, err)
	require.Empty(t, entries)

	// A record of alice's run cannot be used to load bob's run.
	_, err = checkpoint.Load(t.Context(), st, bob, m, t.TempDir(), t.TempDir(), 0)
	require.ErrorIs(t, err, checkpoint.ErrForeign)
}

func TestLoadRefusesAReplacedArchive(t *testing.T) {
	st := openStore(t)
	m, err := checkpoint.Save(t.Context(), st, alice, checkpointDir(t), manifest())
	require.NoError(t, err)
	other := checkpointDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(other, "checkpoint.img"), []byte("another memory"), 0o600))
	_, err = checkpoint.Save(t.Context(), st, alice, other, manifest())
	require.NoError(t, err)

	dst := t.TempDir()
	_, err = checkpoint.Load(t.Context(), st, alice, m, dst, t.TempDir(), 0)
	require.ErrorIs(t, err, checkpoint.ErrDigest)
	entries, err := os.ReadDir(dst)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// copyObject copies a run file from one run to another.
func copyObject(t *testing.T, st *persist.Store, from, to model.RunRef, name string) {
	t.Helper()
	r, err := st.OpenRunFile(t.Context(), from, name)
	require.NoError(t, err)
	raw, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	_, err = st.PutRunFile(t.Context(), to, name, bytes.NewReader(raw), "")
	require.NoError(t, err)
}

func TestPauseAndResumeNeedABackendThatKeepsMemory(t *testing.T) {
	st := openStore(t)
	b := sandboxfake.New()
	m := manifest()
	_, err := checkpoint.Pause(t.Context(), b, nil, st, alice, m, t.TempDir())
	require.ErrorIs(t, err, sandbox.ErrCheckpointUnsupported)

	pol := sandbox.DefaultPolicy()
	pol.Runtime = m.Runtime
	_, _, err = checkpoint.Resume(t.Context(), b, st, alice, manifestOf(m, alice), sandbox.Spec{Image: "img"}, pol, sandbox.Streams{}, t.TempDir(), 0)
	require.ErrorIs(t, err, sandbox.ErrCheckpointUnsupported)

	pol.Runtime = ""
	_, _, err = checkpoint.Resume(t.Context(), b, st, alice, manifestOf(m, alice), sandbox.Spec{Image: "img"}, pol, sandbox.Streams{}, t.TempDir(), 0)
	require.ErrorContains(t, err, `paused under runtime "runsc"`)
}

func TestResumeRefusesALooserPolicy(t *testing.T) {
	st := openStore(t)
	m := manifestOf(manifest(), alice)
	was := *m.Policy
	loosen := map[string]func(p *sandbox.Policy){
		"network": func(p *sandbox.Policy) { p.NetworkMode = "bridge" },
		"rootfs":  func(p *sandbox.Policy) { p.ReadOnlyRootfs = false },
		"memory":  func(p *sandbox.Policy) { p.MemoryBytes *= 2 },
		"pids":    func(p *sandbox.Policy) { p.PidsLimit++ },
		"cpus":    func(p *sandbox.Policy) { p.NanoCPUs *= 2 },
		"tmpfs":   func(p *sandbox.Policy) { p.TmpfsSizeBytes *= 2 },
		"nofile":  func(p *sandbox.Policy) { p.NoFile *= 2 },
		"runtime": func(p *sandbox.Policy) { p.Runtime = "runsc-debug" },
	}
	for name, f := range loosen {
		t.Run(name, func(t *testing.T) {
			pol := was
			f(&pol)
			require.NotEmpty(t, checkpoint.Loosenings(pol, was))
			want := m
			want.Runtime = pol.Runtime
			_, _, err := checkpoint.Resume(t.Context(), sandboxfake.New(), st, alice, want, sandbox.Spec{Image: "img"}, pol, sandbox.Streams{}, t.TempDir(), 0)
			require.ErrorIs(t, err, checkpoint.ErrLooserPolicy)
		})
	}
	// A fresh uid and tighter limits are no loosening.
	pol := was
	pol.User = "10042:10042"
	pol.MemoryBytes /= 2
	require.Empty(t, checkpoint.Loosenings(pol, was))
	m.Policy = nil
	_, _, err := checkpoint.Resume(t.Context(), sandboxfake.New(), st, alice, m, sandbox.Spec{Image: "img"}, was, sandbox.Streams{}, t.TempDir(), 0)
	require.ErrorContains(t, err, "names no policy")
}

func TestSaveOfAnUnpackableDirectoryStoresNothing(t *testing.T) {
	st := openStore(t)
	dir := checkpointDir(t)
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(dir, "zlink")))
	_, err := checkpoint.Save(t.Context(), st, alice, dir, manifest())
	require.ErrorContains(t, err, "not a regular file")
	_, err = st.OpenRunFile(t.Context(), alice, checkpoint.ArchiveObject)
	require.ErrorIs(t, err, persist.ErrNotFound)
}
