package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"
)

// row is one line of the result table.
type row struct {
	what     string
	taskrun  string
	baseline string
	ratio    string
	target   string
	verdict  string
}

// ratioRow compares two durations; a non-zero max is the target ratio.
func ratioRow(what string, got, base time.Duration, baseName string, max float64) row {
	r := row{
		what:     what,
		taskrun:  fmtDuration(got),
		baseline: baseName + ": " + fmtDuration(base),
		ratio:    fmt.Sprintf("%.2f×", float64(got)/float64(base)),
	}
	if max > 0 {
		r.target = fmt.Sprintf("≤ %.2f×", max)
		r.verdict = verdict(float64(got)/float64(base) <= max)
	}
	return r
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func fmtDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

// median of ds (the mean of the middle two for an even count).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// printTable writes the rows as one Markdown table with a header naming the
// machine and the settings.
func printTable(w io.Writer, c config, rows []row) {
	fmt.Fprintf(w, "### taskrun side-by-side benchmarks (%s/%s, %d CPUs, image %s)\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), c.image)
	fmt.Fprintln(w, "| measurement | taskrun | baseline | ratio | target | verdict |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join([]string{r.what, r.taskrun, r.baseline, dash(r.ratio), dash(r.target), dash(r.verdict)}, " | "))
	}
}

func dash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}
