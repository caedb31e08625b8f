// Package persist stores run state, output logs, artifacts, traces and isolation
// records in blob storage: a local directory or memory built in, other
// stores through a driver (package persist/s3).
package persist

import (
	"context"
	"io"

	"github.com/taskrun/taskrun/model"
)

// RunRef names one run and so the tenant-scoped prefix of its blobs. It is
// the run identity every package shares.
type RunRef = model.RunRef

// ObjectInfo describes a stored blob.
type ObjectInfo struct {
	Key         string `json:"key"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
	ContentType string `json:"content_type"`
}

// PersistStorage holds a run's own files (output log, session state, isolation
// record) and run-global files shared by the tenant's runs (traces).
type PersistStorage interface {
	// PutRunFile streams r to the run's object name (e.g. "output.log").
	PutRunFile(ctx context.Context, ref RunRef, name string, r io.Reader, contentType string) (ObjectInfo, error)
	// OpenRunFile opens a run's object for reading.
	OpenRunFile(ctx context.Context, ref RunRef, name string) (io.ReadCloser, error)
	// PutGlobalFile streams r to relPath under the tenant's run-global storage
	// (e.g. "traces/<session>/rt_<id>.jsonl").
	PutGlobalFile(ctx context.Context, userID, relPath string, r io.Reader, contentType string) (ObjectInfo, error)
	// OpenGlobalFile opens a run-global object for reading.
	OpenGlobalFile(ctx context.Context, userID, relPath string) (io.ReadCloser, error)
}

// ArtifactStorage holds the files a run delivers.
type ArtifactStorage interface {
	// PutArtifact streams r to the run's artifact relPath.
	PutArtifact(ctx context.Context, ref RunRef, relPath string, r io.Reader, contentType string) (ObjectInfo, error)
	// OpenArtifact opens a stored artifact.
	OpenArtifact(ctx context.Context, ref RunRef, relPath string) (io.ReadCloser, error)
}
