package daemon

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newProcess() *process {
	return &process{changed: make(chan struct{}), done: make(chan struct{})}
}

// A reader from an offset gets the output from there, a chunk cut where
// the offset falls inside it, and stdout and stderr share the offsets.
func TestProcessOutputFromAnOffset(t *testing.T) {
	p := newProcess()
	_, _ = processWriter{p, false}.Write([]byte("abc"))
	_, _ = processWriter{p, true}.Write([]byte("DE"))
	_, _ = processWriter{p, false}.Write([]byte("fg"))
	chunks, end, res, _ := p.since(4)
	assert.EqualValues(t, 7, end)
	assert.Nil(t, res)
	require.Len(t, chunks, 2)
	assert.Equal(t, chunk{off: 4, stderr: true, data: []byte("E")}, chunks[0])
	assert.Equal(t, chunk{off: 5, data: []byte("fg")}, chunks[1])
	chunks, _, _, _ = p.since(7)
	assert.Empty(t, chunks)
}

// The daemon keeps at most MaxProcessOutput of a command's latest output:
// a reader from an offset older than what is kept gets what is kept, and
// the process says where it starts.
func TestProcessOutputKeepsTheLatest(t *testing.T) {
	p := newProcess()
	block := bytes.Repeat([]byte("x"), 64<<10)
	n := 2 * MaxProcessOutput / len(block)
	for range n {
		_, _ = processWriter{p, false}.Write(block)
	}
	info := p.snapshot()
	assert.EqualValues(t, n*len(block), info.OutputBytes)
	assert.LessOrEqual(t, info.OutputBytes-info.OutputFrom, int64(MaxProcessOutput))
	assert.Positive(t, info.OutputFrom)
	chunks, _, _, _ := p.since(0)
	require.NotEmpty(t, chunks)
	assert.Equal(t, info.OutputFrom, chunks[0].off)
	var kept int
	for _, c := range chunks {
		kept += len(c.data)
	}
	assert.LessOrEqual(t, kept, MaxProcessOutput)
}

// A run with MaxProcesses forgets its oldest ended command for a new one,
// and refuses when all of them run.
func TestLiveRunForgetsTheOldestEndedProcess(t *testing.T) {
	r := &liveRun{procs: map[string]*process{}}
	for i := range MaxProcesses {
		p := newProcess()
		p.info.ID = "p" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		r.procs[p.info.ID] = p
		r.order = append(r.order, p.info.ID)
	}
	assert.False(t, r.forgetEnded(), "every command runs")
	second := r.order[1]
	close(r.procs[second].done)
	close(r.procs[r.order[5]].done)
	require.True(t, r.forgetEnded())
	assert.NotContains(t, r.procs, second, "the oldest ended one is forgotten")
	assert.Len(t, r.order, MaxProcesses-1)
	assert.Len(t, r.procs, MaxProcesses-1)
}
