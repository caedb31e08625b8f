package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ErrBadPolicy is wrapped by every error about an unusable policy, rule or
// credential.
var ErrBadPolicy = errors.New("invalid egress policy")

// Policy is a run's egress policy: deny by default, each rule allows one
// host (or a suffix of hosts), optionally on one port and, for inspected
// traffic, for some methods and path prefixes. It holds no secret: a
// credential names where its value is read on the host.
//
// The file format (--egress-policy FILE) is this struct as JSON; unknown
// fields are refused.
type Policy struct {
	// Rules allow destinations; a connection no rule allows is refused.
	Rules []Rule `json:"rules"`
	// Credentials are injected by the proxy into requests to their host.
	Credentials []Credential `json:"credentials,omitempty"`
	// MaxBytes caps the bytes sent plus received through the proxy during
	// the run; 0 means DefaultMaxBytes.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// MaxConnections caps the upstream connections the run may open; 0 means
	// DefaultMaxConnections.
	MaxConnections int `json:"max_connections,omitempty"`
}

// Budget defaults for a policy that sets none.
const (
	DefaultMaxBytes       int64 = 1 << 30
	DefaultMaxConnections       = 10000
)

// Rule allows a destination.
type Rule struct {
	// Host is an exact host name ("api.github.com"), a suffix pattern
	// ("*.github.com": every name below github.com, not github.com itself)
	// or an IP literal ("127.0.0.1", "::1"). Only a rule naming an IP
	// literal lets the proxy reach a loopback, private, link-local, CGNAT,
	// multicast or metadata address.
	Host string `json:"host"`
	// Port is the one allowed port; 0 allows the standard ports 80 and 443.
	Port int `json:"port,omitempty"`
	// Methods, if set, are the only HTTP methods allowed (e.g. "GET").
	Methods []string `json:"methods,omitempty"`
	// Paths, if set, are the only path prefixes allowed (e.g. "/repos/").
	Paths []string `json:"paths,omitempty"`
}

// Credential is a header the proxy adds to every request to Host, over TLS
// only. The value is read on the host from ValueEnv or ValueFile and never
// enters the sandbox.
type Credential struct {
	// ID names the operator's credential a tenant was granted it by
	// (OperatorCredential.ID), for the records; empty for a run's own.
	ID string `json:"id,omitempty"`
	// Host is the exact host name the header is sent to.
	Host string `json:"host"`
	// Header is the header name, e.g. "Authorization".
	Header string `json:"header"`
	// ValueEnv names the executor's environment variable holding the value.
	ValueEnv string `json:"value_env,omitempty"`
	// ValueFile names a host file holding the value (one trailing newline is dropped).
	ValueFile string `json:"value_file,omitempty"`
	// Format wraps the value, with one %s, e.g. "Bearer %s"; empty means "%s".
	Format string `json:"format,omitempty"`
}

// IsZero reports whether p allows nothing and brokers nothing: a run with
// a zero policy gets no proxy at all.
func (p Policy) IsZero() bool { return len(p.Rules) == 0 && len(p.Credentials) == 0 }

// LoadPolicy reads a JSON policy file and validates it.
func LoadPolicy(path string) (Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, fmt.Errorf("%w: read %s: %w", ErrBadPolicy, path, err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return Policy{}, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy decodes a JSON policy (the format LoadPolicy reads; unknown
// fields are refused) and validates it.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Policy{}, fmt.Errorf("%w: %w (see the egress policy format in README.md)", ErrBadPolicy, err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Validate checks every rule and credential and the budgets.
func (p Policy) Validate() error {
	for i, r := range p.Rules {
		if err := r.validate(); err != nil {
			return fmt.Errorf("rule %d: %w", i+1, err)
		}
	}
	for i, c := range p.Credentials {
		if err := c.validate(); err != nil {
			return fmt.Errorf("credential %d: %w", i+1, err)
		}
		if !slices.ContainsFunc(p.Rules, func(r Rule) bool { return r.matchesHost(c.Host) }) {
			return fmt.Errorf("%w: credential %d for %s: no rule allows that host: add --allow %s:443", ErrBadPolicy, i+1, c.Host, c.Host)
		}
		if slices.ContainsFunc(p.Credentials[:i], func(o Credential) bool {
			return o.Host == c.Host && strings.EqualFold(o.Header, c.Header)
		}) {
			return fmt.Errorf("%w: credential %d: a second %s header for %s", ErrBadPolicy, i+1, c.Header, c.Host)
		}
	}
	if p.MaxBytes < 0 || p.MaxConnections < 0 {
		return fmt.Errorf("%w: max_bytes and max_connections must not be negative", ErrBadPolicy)
	}
	return nil
}

// maxHostLen is the longest DNS name.
const maxHostLen = 253

func (r Rule) validate() error {
	host := strings.TrimPrefix(r.Host, "*.")
	if _, err := netip.ParseAddr(host); err == nil {
		if host != r.Host {
			return fmt.Errorf("%w: %q: a suffix pattern needs a name, not an address", ErrBadPolicy, r.Host)
		}
	} else if err := validName(host); err != nil {
		return fmt.Errorf("%w: host %q: %w", ErrBadPolicy, r.Host, err)
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Errorf("%w: host %s: port %d out of range 1-65535", ErrBadPolicy, r.Host, r.Port)
	}
	for _, m := range r.Methods {
		if m == "" || m != strings.ToUpper(m) || strings.ContainsFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) {
			return fmt.Errorf("%w: host %s: method %q: use an upper-case HTTP method such as GET", ErrBadPolicy, r.Host, m)
		}
	}
	for _, p := range r.Paths {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("%w: host %s: path %q must start with /", ErrBadPolicy, r.Host, p)
		}
	}
	return nil
}

// validName accepts a lower-case DNS name of letters, digits, '-' and '.'.
func validName(host string) error {
	if host == "" || len(host) > maxHostLen {
		return errors.New("empty or longer than 253 bytes")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("bad label %q", label)
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return fmt.Errorf("character %q: use lower-case letters, digits, '-' and '.'", c)
			}
		}
	}
	return nil
}

func (c Credential) validate() error {
	if err := validName(c.Host); err != nil {
		return fmt.Errorf("%w: host %q: %w (a credential names one exact host)", ErrBadPolicy, c.Host, err)
	}
	if c.Header == "" || http.CanonicalHeaderKey(c.Header) == "" || strings.ContainsAny(c.Header, " :\r\n") {
		return fmt.Errorf("%w: %s: header %q is not a header name", ErrBadPolicy, c.Host, c.Header)
	}
	switch http.CanonicalHeaderKey(c.Header) {
	case "Host", "Connection", "Content-Length", "Transfer-Encoding", "Upgrade", "Proxy-Authorization", "Te", "Trailer", "Keep-Alive":
		return fmt.Errorf("%w: %s: header %s cannot carry a credential", ErrBadPolicy, c.Host, c.Header)
	}
	if (c.ValueEnv == "") == (c.ValueFile == "") {
		return fmt.Errorf("%w: %s: set exactly one of value-env and value-file", ErrBadPolicy, c.Host)
	}
	if c.Format != "" && strings.Count(c.Format, "%s") != 1 || strings.Count(c.Format, "%") > 1 {
		return fmt.Errorf("%w: %s: format %q must hold exactly one %%s and no other %%", ErrBadPolicy, c.Host, c.Format)
	}
	return nil
}

// String names the rule the way --allow spells it, with its limits.
func (r Rule) String() string {
	s := r.Host
	if strings.Contains(s, ":") {
		s = "[" + s + "]"
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(r.Port)
	}
	if len(r.Methods) > 0 {
		s += " methods " + strings.Join(r.Methods, ",")
	}
	if len(r.Paths) > 0 {
		s += " paths " + strings.Join(r.Paths, ",")
	}
	return s
}

// matchesHost reports whether the rule names host (ignoring the port).
func (r Rule) matchesHost(host string) bool {
	if suffix, ok := strings.CutPrefix(r.Host, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	if a, err := netip.ParseAddr(r.Host); err == nil {
		b, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == b.Unmap()
	}
	return r.Host == host
}

// matchesPort reports whether the rule allows port.
func (r Rule) matchesPort(port int) bool {
	if r.Port == 0 {
		return port == 80 || port == 443
	}
	return r.Port == port
}

// inspects reports whether the rule limits methods or paths, which needs
// the request in clear.
func (r Rule) inspects() bool { return len(r.Methods) > 0 || len(r.Paths) > 0 }

// allowsRequest reports whether method and path pass the rule's limits.
func (r Rule) allowsRequest(method, path string) bool {
	if len(r.Methods) > 0 && !slices.Contains(r.Methods, method) {
		return false
	}
	if len(r.Paths) > 0 && (!canonicalPath(path) || !slices.ContainsFunc(r.Paths, func(p string) bool { return strings.HasPrefix(path, p) })) {
		return false
	}
	return true
}

// canonicalPath reports whether path (decoded once) has no "." or ".."
// segment and no empty segment, so a prefix check cannot be walked around,
// and nothing an upstream may read as one: a dot segment with parameters
// ("..;"), a backslash ("..\"), a '%' left after decoding (a second
// encoding, "%252e%252e"), a control character.
func canonicalPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "//") || strings.ContainsAny(p, "\\%") ||
		strings.ContainsFunc(p, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return false
	}
	return !slices.ContainsFunc(strings.Split(p, "/"), func(s string) bool {
		s, _, _ = strings.Cut(s, ";")
		return s == "." || s == ".."
	})
}

// ParseAllow parses an --allow value, HOST or HOST:PORT ("[::1]:443" for
// an IPv6 literal), into a rule.
func ParseAllow(s string) (Rule, error) {
	host, portText := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, portText = h, p
	} else if strings.Count(s, ":") == 1 {
		return Rule{}, fmt.Errorf("%w: --allow %q: %w", ErrBadPolicy, s, err)
	}
	r := Rule{Host: strings.ToLower(strings.Trim(host, "[]"))}
	if portText != "" {
		port, err := strconv.Atoi(portText)
		if err != nil || port < 1 || port > 65535 {
			return Rule{}, fmt.Errorf("%w: --allow %q: port must be 1-65535", ErrBadPolicy, s)
		}
		r.Port = port
	}
	if err := r.validate(); err != nil {
		return Rule{}, fmt.Errorf("--allow %q: %w", s, err)
	}
	return r, nil
}

// ParseCredential parses a --credential value: comma-separated key=value
// pairs host=, header=, value-env= or value-file=, and format= (a value may
// be double-quoted to hold commas or spaces), e.g.
//
//	host=api.github.com,header=Authorization,value-env=GH_TOKEN,format="Bearer %s"
func ParseCredential(s string) (Credential, error) {
	fields, err := splitPairs(s)
	if err != nil {
		return Credential{}, fmt.Errorf("%w: --credential %q: %w", ErrBadPolicy, s, err)
	}
	return credentialFromPairs(fields)
}

// credentialFromPairs builds and validates a credential from --credential's pairs.
func credentialFromPairs(fields [][2]string) (Credential, error) {
	var c Credential
	for _, kv := range fields {
		switch kv[0] {
		case "host":
			c.Host = strings.ToLower(kv[1])
		case "header":
			c.Header = kv[1]
		case "value-env":
			c.ValueEnv = kv[1]
		case "value-file":
			c.ValueFile = kv[1]
		case "format":
			c.Format = kv[1]
		default:
			return Credential{}, fmt.Errorf("%w: --credential: unknown key %q: use host=, header=, value-env= or value-file=, format=", ErrBadPolicy, kv[0])
		}
	}
	if err := c.validate(); err != nil {
		return Credential{}, fmt.Errorf("--credential: %w", err)
	}
	return c, nil
}

// splitPairs splits `k=v,k="v,w"` into key/value pairs.
func splitPairs(s string) ([][2]string, error) {
	var out [][2]string
	for s != "" {
		key, rest, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("%q has no '='", s)
		}
		var val string
		if strings.HasPrefix(rest, `"`) {
			end := strings.IndexByte(rest[1:], '"')
			if end < 0 {
				return nil, errors.New("unterminated quote")
			}
			val, rest = rest[1:end+1], rest[end+2:]
			if rest != "" && !strings.HasPrefix(rest, ",") {
				return nil, fmt.Errorf("text after the closing quote of %s", key)
			}
		} else {
			val, rest, _ = strings.Cut(rest, ",")
			rest = "," + rest
			if rest == "," {
				rest = ""
			}
		}
		out = append(out, [2]string{strings.TrimSpace(key), val})
		s = strings.TrimPrefix(rest, ",")
	}
	return out, nil
}

// resolveValue reads the credential's value on the host and formats it.
func (c Credential) resolveValue(getenv func(string) string) (string, error) {
	var v string
	if c.ValueEnv != "" {
		v = getenv(c.ValueEnv)
		if v == "" {
			return "", fmt.Errorf("%w: credential for %s: environment variable %s is empty or unset", ErrBadPolicy, c.Host, c.ValueEnv)
		}
	} else {
		data, err := os.ReadFile(c.ValueFile)
		if err != nil {
			return "", fmt.Errorf("%w: credential for %s: %w", ErrBadPolicy, c.Host, err)
		}
		v = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
		if v == "" {
			return "", fmt.Errorf("%w: credential for %s: %s is empty", ErrBadPolicy, c.Host, c.ValueFile)
		}
	}
	if strings.ContainsAny(v, "\r\n\x00") {
		return "", fmt.Errorf("%w: credential for %s: the value holds a line break or NUL", ErrBadPolicy, c.Host)
	}
	if c.Format != "" {
		v = strings.Replace(c.Format, "%s", v, 1)
	}
	return v, nil
}

// BuildPolicy combines a policy file (empty for none) with --allow and
// --credential values, in that order, and validates the result. No file
// and no flags give the zero policy: no proxy.
func BuildPolicy(file string, allows, credentials []string) (Policy, error) {
	var p Policy
	if file != "" {
		var err error
		if p, err = LoadPolicy(file); err != nil {
			return Policy{}, err
		}
	}
	for _, a := range allows {
		r, err := ParseAllow(a)
		if err != nil {
			return Policy{}, err
		}
		p.Rules = append(p.Rules, r)
	}
	for _, s := range credentials {
		c, err := ParseCredential(s)
		if err != nil {
			return Policy{}, err
		}
		p.Credentials = append(p.Credentials, c)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}
