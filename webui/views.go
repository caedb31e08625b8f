package webui

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/taskrun/taskrun/audit"
	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/termsafe"
)

// Display bounds: what a page shows of a run's records. Each record's full
// form stays downloadable.
const (
	// MaxShownLogBytes is the tail of a stored log a run page shows.
	MaxShownLogBytes = 1 << 20
	// MaxShownPatchBytes is the head of a patch a run page renders.
	MaxShownPatchBytes = 2 << 20
	// MaxShownEntries bounds the lines of a trace, gateway or egress record shown.
	MaxShownEntries = 2000
	// MaxShownJSONBytes bounds one pretty-printed JSON value shown.
	MaxShownJSONBytes = 16 << 10
	// maxRecordLine bounds one line read from a JSON-lines record.
	maxRecordLine = 4 << 20
	// maxAuditBytes bounds an isolation record read.
	maxAuditBytes = 4 << 20
)

// safeText makes untrusted bytes displayable: terminal escapes and control
// characters become visible text (package termsafe). HTML escaping is left
// to html/template.
func safeText(b []byte) string { return termsafe.String(string(b)) }

// clip cuts s to at most n bytes at a character boundary, saying so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("\n… (%d more bytes not shown)", len(s)-cut)
}

// diffLine is one line of a rendered patch.
type diffLine struct {
	Class string // "add", "del", "hunk", "meta" or "ctx"
	Text  string
}

// diffFile is one file section of a rendered patch.
type diffFile struct {
	Header string
	Lines  []diffLine
}

// parsePatch splits a git patch into file sections with classified lines.
func parsePatch(patch []byte) []diffFile {
	var files []diffFile
	cur := -1
	for _, raw := range strings.SplitAfter(string(patch), "\n") {
		line := strings.TrimRight(raw, "\r\n")
		if raw == "" {
			continue
		}
		if strings.HasPrefix(line, "diff --git ") || cur < 0 {
			files = append(files, diffFile{Header: safeText([]byte(line))})
			cur = len(files) - 1
			if strings.HasPrefix(line, "diff --git ") {
				continue
			}
		}
		cls := "ctx"
		switch {
		case strings.HasPrefix(line, "+++ "), strings.HasPrefix(line, "--- "):
			cls = "meta"
		case strings.HasPrefix(line, "@@"):
			cls = "hunk"
		case strings.HasPrefix(line, "+"):
			cls = "add"
		case strings.HasPrefix(line, "-"):
			cls = "del"
		case strings.HasPrefix(line, " "), line == "":
			cls = "ctx"
		default:
			cls = "meta"
		}
		files[cur].Lines = append(files[cur].Lines, diffLine{Class: cls, Text: safeText([]byte(line))})
	}
	return files
}

// timelineEntry is one line of a trace or gateway record.
type timelineEntry struct {
	Time    string
	Kind    string
	Summary string
	Detail  string // pretty JSON (or the raw line), clipped
	Error   string
}

// readLines calls fn for each line of r (at most MaxShownEntries); it
// returns how many lines were left out.
func readLines(r io.Reader, fn func(line []byte)) (omitted int, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxRecordLine)
	n := 0
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		if n >= MaxShownEntries {
			omitted++
			continue
		}
		n++
		fn(sc.Bytes())
	}
	return omitted, sc.Err()
}

// prettyJSON indents a JSON value for display, clipped.
func prettyJSON(raw []byte) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return clip(safeText(raw), MaxShownJSONBytes)
	}
	return clip(safeText(buf.Bytes()), MaxShownJSONBytes)
}

// firstString returns the first of keys that m holds as a string or number.
func firstString(m map[string]json.RawMessage, keys ...string) string {
	for _, k := range keys {
		v, ok := m[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
		var f json.Number
		if json.Unmarshal(v, &f) == nil {
			return f.String()
		}
	}
	return ""
}

// parseTrace renders an agent trace: JSON lines of any shape (the agent
// writes them), each shown with its time, its kind and a one-line summary of
// its fields when it has them. Lines the gateway appended (model exchanges)
// are summarized as such.
func parseTrace(r io.Reader) ([]timelineEntry, int, error) {
	var out []timelineEntry
	omitted, err := readLines(r, func(line []byte) {
		var m map[string]json.RawMessage
		if json.Unmarshal(line, &m) != nil {
			out = append(out, timelineEntry{Kind: "text", Summary: clip(safeText(line), 200), Detail: clip(safeText(line), MaxShownJSONBytes)})
			return
		}
		e := timelineEntry{
			Time:   shortTime(firstString(m, "ts", "time", "timestamp")),
			Kind:   safeText([]byte(firstString(m, "type", "kind", "event", "role"))),
			Detail: prettyJSON(line),
		}
		_, hasSeq := m["seq"]
		_, hasAPI := m["api"]
		switch {
		case e.Kind == "" && hasSeq && hasAPI:
			var x gatewayExchange
			_ = json.Unmarshal(line, &x)
			e.Kind, e.Summary = "model exchange", exchangeSummary(x)
		default:
			e.Summary = firstString(m, "message", "content", "text")
			if e.Summary == "" {
				var data map[string]json.RawMessage
				if json.Unmarshal(m["data"], &data) == nil {
					e.Summary = fieldsSummary(data)
				}
			}
			e.Summary = clip(safeText([]byte(e.Summary)), 240)
		}
		out = append(out, e)
	})
	return out, omitted, err
}

// shortTime shows an RFC 3339 time as its time of day to the millisecond,
// and anything else as it is (made safe).
func shortTime(s string) string {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC().Format("15:04:05.000")
	}
	return clip(safeText([]byte(s)), 40)
}

// fieldsSummary shows an object's fields on one line, key=value, values
// clipped.
func fieldsSummary(m map[string]json.RawMessage) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" · ")
		}
		v := string(m[k])
		var str string
		if json.Unmarshal(m[k], &str) == nil {
			v = str
		}
		b.WriteString(k + "=" + clip(v, 80))
		if b.Len() > 240 {
			break
		}
	}
	return b.String()
}

// gatewayExchange is a line of the gateway's record of model exchanges.
type gatewayExchange struct {
	Time       time.Time `json:"ts"`
	Seq        int64     `json:"seq"`
	API        string    `json:"api"`
	Path       string    `json:"path"`
	Stream     bool      `json:"stream"`
	Status     int       `json:"status"`
	DurationMS int64     `json:"duration_ms"`
	Usage      *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error string `json:"error"`
}

// parseGateway renders the gateway's record, one entry per exchange.
func parseGateway(r io.Reader) ([]timelineEntry, int, error) {
	var out []timelineEntry
	omitted, err := readLines(r, func(line []byte) {
		var x gatewayExchange
		if json.Unmarshal(line, &x) != nil {
			out = append(out, timelineEntry{Kind: "unreadable", Detail: clip(safeText(line), MaxShownJSONBytes)})
			return
		}
		sum := exchangeSummary(x)
		out = append(out, timelineEntry{
			Time:    x.Time.UTC().Format("15:04:05.000"),
			Kind:    "exchange",
			Summary: sum,
			Detail:  prettyJSON(line),
			Error:   safeText([]byte(x.Error)),
		})
	})
	return out, omitted, err
}

// exchangeSummary is one model exchange on one line.
func exchangeSummary(x gatewayExchange) string {
	sum := fmt.Sprintf("#%d %s %s → %d in %d ms", x.Seq, safeText([]byte(x.API)), safeText([]byte(x.Path)), x.Status, x.DurationMS)
	if x.Stream {
		sum += " (stream)"
	}
	if x.Usage != nil {
		sum += fmt.Sprintf(", %d prompt + %d completion tokens", x.Usage.PromptTokens, x.Usage.CompletionTokens)
	}
	return clip(sum, 400)
}

// egressRow is one connection of the egress record, made displayable.
type egressRow struct {
	Time, Kind, Target, Address, Decision, Rule, Reason, Credential string
	Status                                                          int
	BytesUp, BytesDown                                              int64
}

// parseEgress renders the egress proxy's connection record.
func parseEgress(r io.Reader) ([]egressRow, int, error) {
	var out []egressRow
	omitted, err := readLines(r, func(line []byte) {
		var e egress.Entry
		if json.Unmarshal(line, &e) != nil {
			out = append(out, egressRow{Decision: "unreadable", Reason: clip(safeText(line), 500)})
			return
		}
		target := e.Host
		if e.Port != 0 {
			target = fmt.Sprintf("%s:%d", e.Host, e.Port)
		}
		if e.Method != "" || e.Path != "" {
			target += " " + e.Method + " " + e.Path
		}
		t := func(s string) string { return clip(safeText([]byte(s)), 500) }
		out = append(out, egressRow{
			Time: e.Time.UTC().Format("15:04:05.000"), Kind: t(e.Kind), Target: t(target), Address: t(e.Address),
			Decision: t(e.Decision), Rule: t(e.Rule), Reason: t(e.Reason), Credential: t(e.Credential),
			Status: e.Status, BytesUp: e.BytesUp, BytesDown: e.BytesDown,
		})
	})
	return out, omitted, err
}

// nameCredentials adds to each connection that had a credential injected
// the name of the grant it came from, from the run's policy: the header and
// the operator's credential id, never the value (which no record holds).
func nameCredentials(rows []egressRow, pol egress.Policy) {
	for i := range rows {
		r := &rows[i]
		if r.Credential == "" {
			continue
		}
		for _, c := range pol.Credentials {
			if c.ID != "" && c.Header == r.Credential && strings.HasPrefix(r.Target, c.Host+":") {
				r.Credential += " (" + termsafe.String(c.ID) + ")"
				break
			}
		}
	}
}

// comparison is one aspect of confinement as the host set it and as the
// self-check saw it from inside.
type comparison struct {
	Aspect, Host, Inside string
	// Agree is "yes", "no" or "" (not comparable).
	Agree string
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func agree(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// compareViews sets the self-check's view next to the host's.
func compareViews(r *audit.Record) []comparison {
	p := r.Posture
	if r.Probe == nil {
		return nil
	}
	pr := r.Probe
	limit := func(v int64) string {
		switch v {
		case -1:
			return "unlimited"
		case -2:
			return "unknown"
		}
		return fmt.Sprint(v)
	}
	pids := "unset"
	if p.PidsLimit != nil {
		pids = fmt.Sprint(*p.PidsLimit)
	}
	out := []comparison{
		{"user", "User " + p.User, fmt.Sprintf("uid %d gid %d", pr.UID, pr.GID), ""},
		{"capabilities", fmt.Sprintf("CapDrop %v, CapAdd %v", p.CapDrop, p.CapAdd), fmt.Sprintf("CapEff %#x, CapBnd %#x", pr.CapEff, pr.CapBnd), agree(pr.CapEff == 0)},
		{"no-new-privileges", fmt.Sprint(p.SecurityOpt), fmt.Sprintf("NoNewPrivs %d", pr.NoNewPrivs), agree(pr.NoNewPrivs == 1)},
		{"seccomp", fmt.Sprint(p.SecurityOpt), fmt.Sprintf("Seccomp mode %d", pr.Seccomp), agree(pr.Seccomp == 2)},
		{"root filesystem read-only", yesNo(p.ReadonlyRootfs), yesNo(pr.RootfsReadOnly), agree(p.ReadonlyRootfs == pr.RootfsReadOnly)},
		{"/proc/sys read-only", fmt.Sprintf("%d read-only paths", len(p.ReadonlyPaths)), yesNo(pr.ProcSysReadOnly), agree(pr.ProcSysReadOnly)},
		{"pids limit", pids, limit(pr.PidsMax), agree(p.PidsLimit != nil && *p.PidsLimit == pr.PidsMax)},
		{"memory limit", fmt.Sprint(p.Memory), limit(pr.MemoryLimit), agree(p.Memory == pr.MemoryLimit)},
		{"network", "NetworkMode " + p.NetworkMode, fmt.Sprintf("interfaces %v", pr.Interfaces), agree(p.NetworkMode != "none" || len(pr.Interfaces) == 0)},
		{"AppArmor", p.AppArmorProfile, pr.AppArmor, ""},
		{"mounts", fmt.Sprintf("%d mounts", len(p.Mounts)), fmt.Sprintf("%d mountinfo entries", len(pr.Mounts)), ""},
		{"Docker sockets", "none mounted", fmt.Sprintf("%v (search complete: %s)", pr.DockerSockets, yesNo(pr.SocketSearchComplete)), agree(len(pr.DockerSockets) == 0)},
	}
	for _, e := range pr.Egress {
		out = append(out, comparison{"reach " + e.Name + " " + e.Target, "refused", map[bool]string{true: "reachable", false: "unreachable: " + e.Error}[e.Reachable], agree(!e.Reachable || r.Egress != nil)})
	}
	for i := range out {
		out[i].Host, out[i].Inside = safeText([]byte(out[i].Host)), safeText([]byte(out[i].Inside))
	}
	return out
}

// imageView is a run's image as a page shows it: the reference it was
// asked for by, and the digest it ran, shortened for tables with the full
// form kept for a title and for copying.
type imageView struct {
	// Name is the image's name without a digest, e.g. 127.0.0.1:27500/nu/age.
	Name string
	// Digest is the content digest alone (sha256:…); Short its first 12 hex digits.
	Digest, Short string
	// Full is the complete pinned reference, NAME@DIGEST when both are known.
	Full string
}

// imageOf splits a run's image and recorded digest (an image ID sha256:…
// or a registry's repo digest NAME@sha256:…) into its parts, made safe.
func imageOf(image, digest string) imageView {
	image, digest = termsafe.String(image), termsafe.String(digest)
	name := image
	if n, d, ok := strings.Cut(image, "@"); ok {
		name = n
		if digest == "" {
			digest = d
		}
	}
	if n, d, ok := strings.Cut(digest, "@"); ok {
		if name == "" {
			name = n
		}
		digest = d
	}
	v := imageView{Name: name, Digest: digest, Short: shortDigest(digest)}
	switch {
	case name != "" && digest != "":
		v.Full = name + "@" + digest
	case name != "":
		v.Full = name
	default:
		v.Full = digest
	}
	return v
}

// limitRow is one of a run's limits in human units.
type limitRow struct {
	Name, Value string
}

// limitsOf shows a run's limits (runindex.Record.Limits: JSON numbers as
// float64) in human units: sizes in KiB, MiB, GiB; CPU in cores.
func limitsOf(m map[string]any) []limitRow {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]limitRow, 0, len(keys))
	for _, k := range keys {
		out = append(out, limitRow{Name: termsafe.String(k), Value: termsafe.String(limitValue(k, m[k]))})
	}
	return out
}

// limitValue is one limit's value in the unit its name says.
func limitValue(name string, v any) string {
	var n float64
	switch x := v.(type) {
	case float64:
		n = x
	case int:
		n = float64(x)
	case int64:
		n = float64(x)
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return x.String()
		}
		n = f
	default:
		return fmt.Sprint(v)
	}
	switch {
	case n <= 0 && name != "timeout":
		return "unlimited"
	case strings.HasSuffix(name, "_bytes"):
		return humanSize(int64(n))
	case name == "nano_cpus":
		c := strconv.FormatFloat(n/1e9, 'f', -1, 64)
		if c == "1" {
			return "1 core"
		}
		return c + " cores"
	}
	return strconv.FormatFloat(n, 'f', -1, 64)
}
