package webui_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// EnvShots names the directory `make ui-shots` writes the README's
// screenshots to; TestScreenshots is skipped without it.
const EnvShots = "TASKRUN_UI_SHOTS"

// TestScreenshots takes screenshots (PNG) of the demo run's page and its
// isolation page, after checking that they show what the README describes.
func TestScreenshots(t *testing.T) {
	dir := os.Getenv(EnvShots)
	if dir == "" {
		t.Skip(EnvShots + " names no directory (make ui-shots sets it)")
	}
	f := getFixture(t)
	p := newPage(t)
	shots := []struct{ name, path, ready string }{
		{"ui-run.png", "/runs/" + demoRun, "#diff .dl.add"},
		{"ui-isolation.png", "/runs/" + demoRun + "/isolation", "#findings tbody tr"},
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, s := range shots {
		p.do(t, chromedp.EmulateViewport(1100, 1200), chromedp.Navigate(f.url(s.path)), chromedp.WaitReady(chromedp.CSS(s.ready)))
		png, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, s.name), png, 0o644))
		t.Logf("wrote %s (%d bytes)", filepath.Join(dir, s.name), len(png))
	}
}
