package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrBadEnv is wrapped by every error about a run's environment variables.
var ErrBadEnv = errors.New("invalid environment variable")

// maxEnvFileLine bounds one line of an env file.
const maxEnvFileLine = 1 << 20

// ParseEnvVar reads one --env value the way docker run does: NAME=VALUE
// sets NAME to VALUE exactly (which may be empty or contain '='); a bare
// NAME takes its value from lookup (the caller's environment) and is left
// out when lookup has none.
func ParseEnvVar(kv string, lookup func(string) (string, bool)) (string, bool, error) {
	name, _, hasValue := strings.Cut(kv, "=")
	if err := checkEnvName(name); err != nil {
		return "", false, err
	}
	if hasValue {
		return kv, true, nil
	}
	if v, ok := lookup(name); ok {
		return name + "=" + v, true, nil
	}
	return "", false, nil
}

// ParseEnvFile reads an env file in docker's --env-file format: one
// NAME=VALUE or bare NAME per line (see ParseEnvVar); blank lines and lines
// starting with '#' are skipped; leading whitespace is ignored; the value is
// taken verbatim, quotes included, with no expansion. It refuses invalid
// UTF-8, a name containing whitespace and a line with no name, naming the
// line.
func ParseEnvFile(r io.Reader, lookup func(string) (string, bool)) ([]string, error) {
	var env []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxEnvFileLine)
	for n := 1; sc.Scan(); n++ {
		raw := sc.Bytes()
		if n == 1 {
			raw = bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf"))
		}
		if !utf8.Valid(raw) {
			return nil, fmt.Errorf("%w: line %d is not valid UTF-8", ErrBadEnv, n)
		}
		line := strings.TrimLeftFunc(strings.TrimSuffix(string(raw), "\r"), unicode.IsSpace)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kv, ok, err := ParseEnvVar(line, lookup)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if ok {
			env = append(env, kv)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: read env file: %w", ErrBadEnv, err)
	}
	return env, nil
}

// checkEnvName refuses an empty name or one with whitespace, '=' or NUL.
func checkEnvName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: no variable name: write NAME=VALUE", ErrBadEnv)
	case strings.ContainsFunc(name, func(r rune) bool { return unicode.IsSpace(r) || r == 0 }):
		return fmt.Errorf("%w: name %q contains whitespace", ErrBadEnv, name)
	}
	return nil
}

// proxyVariables are set by taskrun when a run has an egress policy.
var proxyVariables = []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"}

// ReservedEnvPrefix starts the names of the variables taskrun sets itself.
const ReservedEnvPrefix = "TASKRUN_"

// CheckEnv validates a run's extra environment (NAME=VALUE entries): each
// has a valid name, none is set twice, and none is a name taskrun sets
// itself (TASKRUN_*, HOME, or a proxy variable in any case).
func CheckEnv(env []string) error {
	seen := map[string]bool{}
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%w: %q has no '=': write NAME=VALUE", ErrBadEnv, kv)
		}
		if err := checkEnvName(name); err != nil {
			return err
		}
		if strings.ContainsRune(kv, 0) {
			return fmt.Errorf("%w: the value of %s contains a NUL byte", ErrBadEnv, name)
		}
		if reason := reservedEnv(name); reason != "" {
			return fmt.Errorf("%w: %s is set by taskrun (%s): choose another name", ErrBadEnv, name, reason)
		}
		if seen[name] {
			return fmt.Errorf("%w: %s is set twice", ErrBadEnv, name)
		}
		seen[name] = true
	}
	return nil
}

// reservedEnv says why taskrun owns name, or "" if it does not.
func reservedEnv(name string) string {
	switch {
	case strings.HasPrefix(name, ReservedEnvPrefix):
		return "the run's identity, input and model gateway"
	case name == "HOME":
		return "the run's home, /taskrun/home"
	}
	for _, p := range proxyVariables {
		if strings.EqualFold(name, p) {
			return "the run's egress proxy"
		}
	}
	return ""
}
