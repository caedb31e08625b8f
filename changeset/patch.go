package changeset

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // git names blobs by SHA-1; used only for the patch's index lines
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"

	"compress/zlib"
)

// zeroBlob is git's name for "no blob" in an index line.
var zeroBlob = strings.Repeat("0", 40)

// binarySniffBytes is how much of a file git inspects for a NUL byte to
// decide that it is binary.
const binarySniffBytes = 8000

// gitBlobID returns git's object name of a blob holding content.
func gitBlobID(content []byte) string {
	h := sha1.New() //nolint:gosec // see import
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write(content)
	return hex.EncodeToString(h.Sum(nil))
}

// isBinary applies git's heuristic: a NUL byte in the first 8000 bytes.
func isBinary(content []byte) bool {
	return bytes.IndexByte(content[:min(len(content), binarySniffBytes)], 0) >= 0
}

// quotePath returns name as git writes it in a patch header: as is, or
// C-quoted when it holds a quote, backslash, control or non-ASCII byte.
func quotePath(name string) string {
	needs := false
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '"' || c == '\\' || c < 0x20 || c >= 0x7f {
			needs = true
			break
		}
	}
	if !needs {
		return name
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if c < 0x20 || c >= 0x7f {
				b.WriteString(`\` + strconv.FormatInt(int64(c)|0o1000, 8)[1:])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// prefixed returns the header name of path under prefix ("a/" or "b/").
func prefixed(prefix, path string) string {
	return quotePath(prefix + path)
}

// base85 is git's base-85 alphabet for binary patches.
const base85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

// writeBinaryLiteral writes a "GIT binary patch" body whose forward hunk is
// the whole new content, deflated and base-85 encoded in lines of at most 52
// bytes, as git does.
func writeBinaryLiteral(w io.Writer, content []byte) error {
	var z bytes.Buffer
	zw, err := zlib.NewWriterLevel(&z, zlib.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(content); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "GIT binary patch\nliteral %d\n", len(content)); err != nil {
		return err
	}
	data := z.Bytes()
	line := make([]byte, 0, 1+65+1)
	for len(data) > 0 {
		n := min(len(data), 52)
		chunk := data[:n]
		data = data[n:]
		line = line[:0]
		if n <= 26 {
			line = append(line, byte('A'+n-1))
		} else {
			line = append(line, byte('a'+n-27))
		}
		for i := 0; i < n; i += 4 {
			var acc uint32
			for j := range 4 {
				acc <<= 8
				if i+j < n {
					acc |= uint32(chunk[i+j])
				}
			}
			var enc [5]byte
			for j := 4; j >= 0; j-- {
				enc[j] = base85[acc%85]
				acc /= 85
			}
			line = append(line, enc[:]...)
		}
		line = append(line, '\n')
		if _, err := w.Write(line); err != nil {
			return err
		}
	}
	_, err = io.WriteString(w, "\n")
	return err
}
