package persist_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/taskrun/taskrun/persist"
)

// BenchmarkPut measures upload throughput to a file:// store for a
// re-readable source (hashed, then uploaded) and a one-pass stream (hashed
// while uploading, plus a digest record).
func BenchmarkPut(b *testing.B) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16)
	for _, bc := range []struct {
		name string
		src  func() io.Reader
	}{
		{"seekable", func() io.Reader { return bytes.NewReader(data) }},
		{"streamed", func() io.Reader { return streamOnlyReader{bytes.NewReader(data)} }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := persist.Open(context.Background(), "file://"+filepath.Join(b.TempDir(), "store"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if err := s.Close(); err != nil {
					b.Error(err)
				}
			})
			ref := persist.RunRef{UserID: "u", ConversationID: "c", TaskID: "t", RunID: "r"}
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := s.PutArtifact(context.Background(), ref, "blob.bin", bc.src(), "application/octet-stream"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
