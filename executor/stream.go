package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/taskrun/taskrun/workerclient"
)

// streamFinishTimeout bounds finishStream: how long a run's end waits for
// the control plane to acknowledge the output it has not yet.
var streamFinishTimeout = time.Minute

// ErrOutputNotDelivered is wrapped by the reason of a run whose output the
// control plane did not acknowledge whole: the stored output log has it.
var ErrOutputNotDelivered = errors.New("output not delivered to the control plane")

// finishStream makes sure the control plane holds the run's whole stdout
// and its end before the terminal report: when the live stream did not end
// (its sender gave up, or the executor died and recovery finishes the run),
// the stdout spool is sent again from its start (the control plane keeps
// the bytes it holds and takes the rest) and the stream ended. What still
// fails is recorded in wd.streamLoss, with the bytes acknowledged, for the
// report: SUCCEEDED never hides a loss. It runs before release, while the
// spool is on disk.
func finishStream(ctx context.Context, p *plan, wd *workdir, ex execution) {
	sender := p.in.StreamSender
	if sender == nil || ex.StreamEnded {
		return
	}
	f, err := os.Open(filepath.Join(p.hostDir, stdoutSpoolName))
	if errors.Is(err, os.ErrNotExist) {
		// No container printed anything: the stream is empty.
		f, err = os.Open(os.DevNull)
	}
	if err != nil {
		wd.streamLoss = fmt.Errorf("%w: read the stdout spool: %w", ErrOutputNotDelivered, err)
		return
	}
	defer f.Close()
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	// A resumed run's stream goes on where it paused: the control plane
	// holds the bytes before.
	var from int64
	if p.in.restore != nil && !p.in.restore.fork {
		from = min(p.in.restore.manifest.StdoutOffset, size)
		if _, err := f.Seek(from, io.SeekStart); err != nil {
			wd.streamLoss = fmt.Errorf("%w: read the stdout spool: %w", ErrOutputNotDelivered, err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(ctx, streamFinishTimeout)
	defer cancel()
	sent, err := workerclient.Pump(ctx, f, p.ref.RunID, sender, workerclient.PumpOptions{StartOffset: from})
	if err != nil {
		wd.streamLoss = fmt.Errorf("%w: the control plane acknowledged %d of the %d stdout bytes (the stored %s holds them all): %w",
			ErrOutputNotDelivered, sent, size, OutputLogName, err)
		p.log.Warn("finish the output stream", "acknowledged_bytes", sent, "bytes", size, "err", err)
		return
	}
	p.log.Info("output stream finished after the live stream stopped", "bytes", sent)
}
