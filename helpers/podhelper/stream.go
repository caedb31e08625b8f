package podhelper

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The fill stream carries the run's mounts from the executor into the Pod's
// data volume over the fill container's stdin. It is a magic line, then one
// section per mount, then an end line:
//
//	taskrun-pod-fill 1\n
//	dir <name>\n   chunks of a PackHome archive
//	file <name> <octal mode>\n   chunks of the file's bytes
//	end\n
//
// A chunk is a big-endian uint32 length and that many bytes; a zero length
// ends the section. A stream without its end line is refused, so a broken
// connection can never pass for a complete workspace.
const (
	streamMagic = "taskrun-pod-fill 1"
	// maxChunk is the largest chunk a writer sends and a reader accepts.
	maxChunk = 1 << 20
	// maxLine bounds a section's header line.
	maxLine = 512
)

// Section kinds.
const (
	KindDir  = "dir"
	KindFile = "file"
)

// ErrTruncated is returned for a fill stream that ends before its end line.
var ErrTruncated = errors.New("fill stream ended before its end line")

// StreamWriter writes a fill stream.
type StreamWriter struct {
	w   *bufio.Writer
	err error
}

// NewStreamWriter starts a fill stream on w.
func NewStreamWriter(w io.Writer) *StreamWriter {
	s := &StreamWriter{w: bufio.NewWriterSize(w, 64<<10)}
	_, s.err = s.w.WriteString(streamMagic + "\n")
	return s
}

// Section writes one section: the header, then what body writes, chunked.
func (s *StreamWriter) Section(kind, name string, mode uint32, body func(io.Writer) error) error {
	if s.err != nil {
		return s.err
	}
	if !validName(name) {
		return fmt.Errorf("fill stream: invalid section name %q", name)
	}
	header := kind + " " + name
	if kind == KindFile {
		header += " " + strconv.FormatUint(uint64(mode), 8)
	}
	if _, s.err = s.w.WriteString(header + "\n"); s.err != nil {
		return s.err
	}
	cw := &chunkWriter{w: s.w}
	if err := body(cw); err != nil {
		s.err = err
		return err
	}
	if cw.err != nil {
		s.err = cw.err
		return s.err
	}
	_, s.err = s.w.Write([]byte{0, 0, 0, 0})
	return s.err
}

// Close writes the end line and flushes.
func (s *StreamWriter) Close() error {
	if s.err != nil {
		return s.err
	}
	if _, err := s.w.WriteString("end\n"); err != nil {
		return err
	}
	return s.w.Flush()
}

// chunkWriter frames writes as chunks.
type chunkWriter struct {
	w   io.Writer
	err error
}

// Write implements io.Writer.
func (c *chunkWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n := 0
	for len(p) > 0 {
		k := min(len(p), maxChunk)
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(k))
		if _, c.err = c.w.Write(hdr[:]); c.err != nil {
			return n, c.err
		}
		if _, c.err = c.w.Write(p[:k]); c.err != nil {
			return n, c.err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// Section is one section header of a fill stream.
type Section struct {
	Kind string
	Name string
	Mode uint32
}

// StreamReader reads a fill stream.
type StreamReader struct {
	r *bufio.Reader
}

// NewStreamReader checks the magic line of the stream on r.
func NewStreamReader(r io.Reader) (*StreamReader, error) {
	s := &StreamReader{r: bufio.NewReaderSize(r, 64<<10)}
	line, err := s.line()
	if err != nil {
		return nil, err
	}
	if line != streamMagic {
		return nil, fmt.Errorf("fill stream: bad magic line %q", line)
	}
	return s, nil
}

// Next returns the next section and a reader of its body, which must be
// read to EOF before Next is called again; io.EOF after the end line.
func (s *StreamReader) Next() (Section, io.Reader, error) {
	line, err := s.line()
	if err != nil {
		return Section{}, nil, err
	}
	if line == "end" {
		return Section{}, nil, io.EOF
	}
	f := strings.Fields(line)
	var sec Section
	switch {
	case len(f) == 2 && f[0] == KindDir:
		sec = Section{Kind: KindDir, Name: f[1]}
	case len(f) == 3 && f[0] == KindFile:
		mode, err := strconv.ParseUint(f[2], 8, 32)
		if err != nil {
			return Section{}, nil, fmt.Errorf("fill stream: bad mode in %q", line)
		}
		sec = Section{Kind: KindFile, Name: f[1], Mode: uint32(mode) & 0o777}
	default:
		return Section{}, nil, fmt.Errorf("fill stream: bad section line %q", line)
	}
	if !validName(sec.Name) {
		return Section{}, nil, fmt.Errorf("fill stream: invalid section name %q", sec.Name)
	}
	return sec, &chunkReader{r: s.r}, nil
}

// line reads one header line.
func (s *StreamReader) line() (string, error) {
	var b strings.Builder
	for b.Len() <= maxLine {
		c, err := s.r.ReadByte()
		if errors.Is(err, io.EOF) {
			return "", ErrTruncated
		}
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return b.String(), nil
		}
		b.WriteByte(c)
	}
	return "", fmt.Errorf("fill stream: header line over %d bytes", maxLine)
}

// chunkReader reads one section's chunks until the zero-length chunk.
type chunkReader struct {
	r    *bufio.Reader
	left uint32
	done bool
}

// Read implements io.Reader.
func (c *chunkReader) Read(p []byte) (int, error) {
	for c.left == 0 {
		if c.done {
			return 0, io.EOF
		}
		var hdr [4]byte
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return 0, ErrTruncated
		}
		c.left = binary.BigEndian.Uint32(hdr[:])
		if c.left == 0 {
			c.done = true
			return 0, io.EOF
		}
		if c.left > maxChunk {
			return 0, fmt.Errorf("fill stream: chunk of %d bytes over %d", c.left, maxChunk)
		}
	}
	if uint32(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= uint32(n)
	if errors.Is(err, io.EOF) {
		err = ErrTruncated
	}
	return n, err
}

// validName accepts the section names the executor writes: m0, m1, ...
func validName(name string) bool {
	if len(name) < 2 || len(name) > 8 || name[0] != 'm' {
		return false
	}
	for _, c := range name[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// SectionName is the data volume's entry of the i-th mount.
func SectionName(i int) string { return "m" + strconv.Itoa(i) }
