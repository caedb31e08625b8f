package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/persist"
)

// The run files a checkpoint is stored as, under the run's tenant prefix
// like its other files.
const (
	// ArchiveObject is the packed checkpoint.
	ArchiveObject = "checkpoint/checkpoint.tar.zst"
	// ManifestObject is the manifest Save returned, for listings; Load
	// trusts the manifest the run's record kept, not this copy.
	ManifestObject = "checkpoint/checkpoint.json"
	// archiveType is the archive object's content type.
	archiveType = "application/zstd"
)

// Storage is where checkpoints are stored: the run files of a
// persist.Store (persist.PersistStorage).
type Storage interface {
	PutRunFile(ctx context.Context, ref model.RunRef, name string, r io.Reader, contentType string) (persist.ObjectInfo, error)
	OpenRunFile(ctx context.Context, ref model.RunRef, name string) (io.ReadCloser, error)
}

// Save packs the checkpoint directory dir and stores it as objects of run
// ref, under ref's tenant. m's Tenant and Run are set from ref. The
// manifest returned names the
// archive's digest: keep it in the run's record, since Load checks the
// archive against it.
func Save(ctx context.Context, st Storage, ref model.RunRef, dir string, m Manifest) (Manifest, error) {
	if err := ref.Validate(); err != nil {
		return m, fmt.Errorf("checkpoint: save: %w", err)
	}
	m.Tenant, m.Run = ref.UserID, ref.RunID
	// The archive streams to the store as it is packed: no copy of it
	// is written on the host.
	pr, pw := io.Pipe()
	packed := make(chan error, 1)
	go func() {
		var err error
		m, err = Pack(dir, m, pw)
		pw.CloseWithError(err)
		packed <- err
	}()
	_, putErr := st.PutRunFile(ctx, ref, ArchiveObject, pr, archiveType)
	pr.CloseWithError(errors.Join(putErr, io.ErrClosedPipe))
	if err := <-packed; err != nil {
		return m, err
	}
	if putErr != nil {
		return m, fmt.Errorf("checkpoint: store the archive of run %s: %w", ref.RunID, putErr)
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, fmt.Errorf("checkpoint: manifest: %w", err)
	}
	if _, err := st.PutRunFile(ctx, ref, ManifestObject, bytes.NewReader(raw), "application/json"); err != nil {
		return m, fmt.Errorf("checkpoint: store the manifest of run %s: %w", ref.RunID, err)
	}
	return m, nil
}

// Load fetches the checkpoint stored for run ref into tmpDir and unpacks it
// into dst (an existing empty directory) once it checked it against want,
// the manifest the run's record kept (see Unpack): a changed archive fails
// with ErrDigest, another run's with ErrForeign, and nothing is unpacked.
// maxBytes bounds what it unpacks to (0: no bound).
func Load(ctx context.Context, st Storage, ref model.RunRef, want Manifest, dst, tmpDir string, maxBytes int64) (Manifest, error) {
	if want.Tenant != ref.UserID || want.Run != ref.RunID {
		return Manifest{}, fmt.Errorf("checkpoint: load run %s of tenant %s: %w: the record names run %q of tenant %q",
			ref.RunID, ref.UserID, ErrForeign, want.Run, want.Tenant)
	}
	r, err := st.OpenRunFile(ctx, ref, ArchiveObject)
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: open the archive of run %s: %w", ref.RunID, err)
	}
	defer r.Close()
	f, err := os.CreateTemp(tmpDir, "checkpoint-*.tar.zst")
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: load: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), r); err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: fetch the archive of run %s: %w", ref.RunID, err)
	}
	if err := f.Close(); err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: load: %w", err)
	}
	return unpack(f.Name(), "sha256:"+hex.EncodeToString(h.Sum(nil)), Expect{Manifest: want, MaxBytes: maxBytes}, dst)
}
