package webui

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePatchClassifiesLines(t *testing.T) {
	patch := "diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n ctx\n-old\n+new\x1b[31m\ndiff --git a/y b/y\nnew file mode 100644\n"
	files := parsePatch([]byte(patch))
	require.Len(t, files, 2)
	assert.Equal(t, "diff --git a/x b/x", files[0].Header)
	var classes []string
	for _, l := range files[0].Lines {
		classes = append(classes, l.Class)
	}
	assert.Equal(t, []string{"meta", "meta", "meta", "hunk", "ctx", "del", "add"}, classes)
	assert.Equal(t, "+new^[[31m", files[0].Lines[6].Text, "terminal escapes made visible")
	assert.Equal(t, "new file mode 100644", files[1].Lines[0].Text)
}

func TestParseTraceSummarizesEachKind(t *testing.T) {
	trace := `{"ts":"2026-12-01T05:52:43.682380592Z","event":"tool_call","data":{"name":"write_file","arguments":"{\"path\":\"a\"}"}}
not json at all ` + "\x1b]0;x\x07" + `
{"ts":"2026-12-01T05:52:43.7Z","seq":2,"api":"chat.completions","path":"/v1/chat/completions","status":200,"duration_ms":12,"usage":{"prompt_tokens":5,"completion_tokens":7}}
`
	entries, omitted, err := parseTrace(strings.NewReader(trace))
	require.NoError(t, err)
	assert.Zero(t, omitted)
	require.Len(t, entries, 3)
	assert.Equal(t, "05:52:43.682", entries[0].Time)
	assert.Equal(t, "tool_call", entries[0].Kind)
	assert.Equal(t, `arguments={"path":"a"} · name=write_file`, entries[0].Summary)
	assert.Equal(t, "text", entries[1].Kind)
	assert.Equal(t, "not json at all ^[]0;x^G", entries[1].Summary)
	assert.Equal(t, "model exchange", entries[2].Kind)
	assert.Equal(t, "#2 chat.completions /v1/chat/completions → 200 in 12 ms, 5 prompt + 7 completion tokens", entries[2].Summary)
}

func TestTimelinesAreBounded(t *testing.T) {
	var b strings.Builder
	for range MaxShownEntries + 5 {
		b.WriteString(`{"event":"e"}` + "\n")
	}
	entries, omitted, err := parseTrace(strings.NewReader(b.String()))
	require.NoError(t, err)
	assert.Len(t, entries, MaxShownEntries)
	assert.Equal(t, 5, omitted)
	assert.Equal(t, "ab\n… (2 more bytes not shown)", clip("abcd", 2))
	assert.Equal(t, "a\n… (2 more bytes not shown)", clip("aé", 2), "cut at a character boundary")
}

// An image shows as its name and digest whether the digest recorded is a
// registry's repo digest, a local image ID or missing.
func TestImageOf(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	assert.Equal(t, imageView{Name: "127.0.0.1:27500/nu/age", Digest: "sha256:" + hex, Short: "sha256:abababababab", Full: "127.0.0.1:27500/nu/age@sha256:" + hex},
		imageOf("127.0.0.1:27500/nu/age", "127.0.0.1:27500/nu/age@sha256:"+hex))
	assert.Equal(t, imageView{Name: "taskrun/agent:local", Digest: "sha256:" + hex, Short: "sha256:abababababab", Full: "taskrun/agent:local@sha256:" + hex},
		imageOf("taskrun/agent:local", "sha256:"+hex))
	assert.Equal(t, imageView{Name: "reg.example/x", Digest: "sha256:" + hex, Short: "sha256:abababababab", Full: "reg.example/x@sha256:" + hex},
		imageOf("", "reg.example/x@sha256:"+hex))
	assert.Equal(t, imageView{Name: "alpine", Full: "alpine"}, imageOf("alpine", ""))
}

// Limits read back from JSON show in human units, never as 2.147483648e+09.
func TestLimitsOf(t *testing.T) {
	got := limitsOf(map[string]any{"memory_bytes": 2147483648.0, "nano_cpus": 1e9, "pids": 512.0, "max_output_bytes": 0.0})
	assert.Equal(t, []limitRow{{"max_output_bytes", "unlimited"}, {"memory_bytes", "2.0 GiB"}, {"nano_cpus", "1 core"}, {"pids", "512"}}, got)
}
