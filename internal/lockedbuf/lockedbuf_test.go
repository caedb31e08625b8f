package lockedbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestConcurrentWritesAllLand(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, strings.Repeat("x", 800), b.String())
}

func TestSeenClosesOnceTheMarkerArrives(t *testing.T) {
	var b Buffer
	_, _ = b.Write([]byte("early"))
	select {
	case <-b.Seen("ear"):
	default:
		t.Fatal("a marker already written must be seen at once")
	}
	later := b.Seen("ready")
	_, _ = b.Write([]byte(" rea"))
	select {
	case <-later:
		t.Fatal("seen before the marker was complete")
	default:
	}
	_, _ = b.Write([]byte("dy"))
	<-later // a marker split across writes is seen
}
