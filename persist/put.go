package persist

// How uploads get their SHA-256 digest.
//
// A bucket fixes an object's metadata when its writer opens, but a stream's
// digest is known only at its end. The store never buffers a whole upload in
// memory nor copies it to a temporary file, so it resolves this in two ways:
//
//   - Re-readable sources (an io.ReadSeeker whose Seek works, such as a
//     regular *os.File or *bytes.Reader) are hashed in a first pass, then
//     uploaded from the same start offset with the digest in the object's
//     "sha256" metadata. The upload hashes again as it streams; if the bytes
//     differ from the first pass the write is aborted before it commits and
//     the put fails with ErrSourceChanged. Only these sources are retried.
//   - Other sources (pipes, network bodies) are streamed once to the final
//     key while hashing. The object's metadata carries a random "digestid";
//     after the upload commits, the digest is written to a small JSON record
//     at "tenants/<user>/digests/<rest of key>" that repeats that digestid.
//     Stat trusts the record only when the ids match, so a record left from
//     an older version of the object is never reported for a newer one.
//
// Either way the returned ObjectInfo and Stat give the digest of the bytes
// stored, and OpenRunFile and friends return exactly those bytes.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrSourceChanged marks an upload whose re-readable source returned
// different bytes on the upload pass than on the hashing pass. Nothing was
// committed.
var ErrSourceChanged = errors.New("persist: upload source changed between hashing and upload")

const (
	// metaSHA256 is the metadata key holding the hex SHA-256 of the object.
	metaSHA256 = "sha256"
	// metaDigestID links a streamed object to its digest record.
	metaDigestID = "digestid"
	// defaultContentType is used when the caller gives none.
	defaultContentType = "application/octet-stream"
)

// digestRecord is the JSON record of a streamed upload's digest.
type digestRecord struct {
	Key      string `json:"key"`
	DigestID string `json:"digest_id"`
	SHA256   string `json:"sha256"`
	Size     int64  `json:"size"`
}

// digest is what an upload pass measured.
type digest struct {
	sha256 string
	size   int64
}

// put stores r at k; see the comment at the top of this file.
func (s *Store) put(ctx context.Context, k objectKey, r io.Reader, contentType string) (ObjectInfo, error) {
	if r == nil {
		return ObjectInfo{}, fmt.Errorf("persist: put %s: nil reader: pass the content to upload", k)
	}
	if contentType == "" {
		contentType = defaultContentType
	}
	unlock := s.locks.lock(k.String())
	defer unlock()
	if rs, ok := r.(io.ReadSeeker); ok {
		if start, err := rs.Seek(0, io.SeekCurrent); err == nil {
			return s.putSeekable(ctx, k, rs, start, contentType)
		}
	}
	return s.putStream(ctx, k, r, contentType)
}

// putSeekable hashes rs from start, then uploads it with the digest in the
// object's metadata, retrying transient failures from start.
func (s *Store) putSeekable(ctx context.Context, k objectKey, rs io.ReadSeeker, start int64, contentType string) (ObjectInfo, error) {
	want, err := hashSource(rs)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("persist: put %s: %w", k, err)
	}
	opts := WriterOptions{ContentType: contentType, Metadata: map[string]string{metaSHA256: want.sha256}}
	err = s.do(ctx, "put", k.String(), func(ctx context.Context) error {
		if _, err := rs.Seek(start, io.SeekStart); err != nil {
			return &sourceError{err}
		}
		_, err := s.write(ctx, k.String(), rs, opts, &want)
		return err
	})
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: k.String(), Size: want.size, SHA256: want.sha256, ContentType: contentType}, nil
}

// putStream uploads r in one pass and then records its digest.
func (s *Store) putStream(ctx context.Context, k objectKey, r io.Reader, contentType string) (ObjectInfo, error) {
	id := rand.Text()
	opts := WriterOptions{ContentType: contentType, Metadata: map[string]string{metaDigestID: id}}
	got, err := s.write(ctx, k.String(), r, opts, nil)
	if err != nil {
		return ObjectInfo{}, s.classify(ctx, "put", k.String(), err)
	}
	rec, err := json.Marshal(digestRecord{Key: k.String(), DigestID: id, SHA256: got.sha256, Size: got.size})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("persist: encode digest record of %s: %w", k, err)
	}
	recOpts := WriterOptions{ContentType: "application/json"}
	err = s.do(ctx, "put digest record of", k.String(), func(ctx context.Context) error {
		return writeAll(ctx, s.bucket, k.digestKey(), rec, recOpts)
	})
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: k.String(), Size: got.size, SHA256: got.sha256, ContentType: contentType}, nil
}

// write streams src to key in one attempt, hashing as it goes. With want set,
// a digest mismatch aborts the write before it commits.
func (s *Store) write(ctx context.Context, key string, src io.Reader, opts WriterOptions, want *digest) (digest, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.bucket.NewWriter(wctx, key, opts)
	if err != nil {
		return digest{}, err
	}
	h := sha256.New()
	sr := &recordingReader{r: src}
	n, err := io.Copy(w, io.TeeReader(sr, h))
	if sr.err != nil {
		err = &sourceError{sr.err}
	}
	got := digest{sha256: hex.EncodeToString(h.Sum(nil)), size: n}
	if err == nil && want != nil && got != *want {
		err = fmt.Errorf("%w: first pass %d bytes sha256 %s, upload pass %d bytes sha256 %s",
			ErrSourceChanged, want.size, want.sha256, got.size, got.sha256)
	}
	if err != nil {
		cancel() // Abort: a canceled writer commits nothing.
		_ = w.Close()
		return digest{}, err
	}
	if err := w.Close(); err != nil {
		return digest{}, err
	}
	return got, nil
}

// recordingReader remembers the first read error of the upload source, so
// source failures are told apart from store failures.
type recordingReader struct {
	r   io.Reader
	err error
}

func (r *recordingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && r.err == nil {
		r.err = err
	}
	return n, err
}

// hashSource reads r to its end and returns its digest.
func hashSource(r io.Reader) (digest, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return digest{}, &sourceError{err}
	}
	return digest{sha256: hex.EncodeToString(h.Sum(nil)), size: n}, nil
}

// recordedDigest reads the digest record of k and returns its SHA-256 if it
// belongs to the object version carrying id, and "" otherwise.
func (s *Store) recordedDigest(ctx context.Context, k objectKey, id string) (string, error) {
	var raw []byte
	err := s.do(ctx, "read digest record of", k.String(), func(ctx context.Context) error {
		var err error
		raw, err = readAll(ctx, s.bucket, k.digestKey())
		return err
	})
	if errors.Is(err, ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var rec digestRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return "", fmt.Errorf("persist: decode digest record of %s: %w", k, err)
	}
	if rec.DigestID != id || rec.Key != k.String() {
		return "", nil
	}
	return rec.SHA256, nil
}
