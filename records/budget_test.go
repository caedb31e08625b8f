package records_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/records"
)

func TestLimitFor(t *testing.T) {
	assert.Equal(t, records.DefaultLimit, records.LimitFor(0))
	assert.Equal(t, records.DefaultLimit, records.LimitFor(-1))
	assert.Equal(t, records.MinLimit, records.LimitFor(1000))
	assert.Equal(t, int64(32<<20), records.LimitFor(32<<20))
}

// Records written by a flooding agent through several writers never grow
// past the shared budget together; each record keeps whole lines and ends
// in one marker line; later writes are refused with ErrExhausted.
//
// Without the budget, the 2 MiB flood lands on the host in full.
func TestWritersShareTheBudgetAndEndInAMarker(t *testing.T) {
	dir := t.TempDir()
	b := records.NewBudget(64 << 10)
	files := map[string]*os.File{}
	writers := map[string]*records.Writer{}
	for _, name := range []string{"gateway", "trace"} {
		f, err := os.Create(filepath.Join(dir, name))
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		files[name], writers[name] = f, b.Writer(name, f)
	}
	var wg sync.WaitGroup
	for name, w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				line := fmt.Sprintf(`{"record":%q,"i":%d,"body":%q}`+"\n", name, i, strings.Repeat("x", 1000))
				n, err := w.Write([]byte(line))
				if err != nil {
					assert.ErrorIs(t, err, records.ErrExhausted)
					assert.Zero(t, n)
				} else {
					assert.Equal(t, len(line), n)
				}
			}
		}()
	}
	wg.Wait()

	var total int64
	for name, f := range files {
		info, err := f.Stat()
		require.NoError(t, err)
		total += info.Size()
		data, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		require.NotEmpty(t, lines)
		for _, l := range lines {
			assert.True(t, json.Valid([]byte(l)), "a whole JSON line: %.60q", l)
		}
		var m records.Marker
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &m))
		assert.True(t, m.Truncated, "%s ends in the marker", name)
		assert.Equal(t, name, m.Record)
		assert.EqualValues(t, 64<<10, m.BudgetBytes)
		assert.Equal(t, 1, strings.Count(string(data), "taskrun_record_truncated"), "one marker per record")
		assert.Positive(t, writers[name].Refused())
	}
	assert.LessOrEqual(t, total, b.Limit(), "the records outgrew their budget")
	assert.Equal(t, b.Used(), total, "every byte written was granted, markers included")
	assert.Positive(t, b.Refused())
}

// Take grants what is left and no more.
func TestTakeGrantsWhatIsLeft(t *testing.T) {
	b := records.NewBudget(10)
	assert.EqualValues(t, 6, b.Take(6))
	assert.EqualValues(t, 4, b.Take(6))
	assert.EqualValues(t, 0, b.Take(1))
	assert.EqualValues(t, 10, b.Used())
	assert.EqualValues(t, 3, b.Refused())
}

// A writer made when not even its marker fits refuses everything and
// writes nothing.
func TestWriterOnASpentBudgetWritesNothing(t *testing.T) {
	b := records.NewBudget(10)
	b.Take(10)
	var buf bytes.Buffer
	w := b.Writer("late", &buf)
	_, err := w.Write([]byte("x\n"))
	require.ErrorIs(t, err, records.ErrExhausted)
	assert.Zero(t, buf.Len())
}
