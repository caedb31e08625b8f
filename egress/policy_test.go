package egress

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseAllow(t *testing.T) {
	for in, want := range map[string]Rule{
		"api.github.com":     {Host: "api.github.com"},
		"API.GitHub.com:443": {Host: "api.github.com", Port: 443},
		"*.npmjs.org":        {Host: "*.npmjs.org"},
		"127.0.0.1:8080":     {Host: "127.0.0.1", Port: 8080},
		"[::1]:443":          {Host: "::1", Port: 443},
		"::1":                {Host: "::1"},
	} {
		got, err := ParseAllow(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "host:0", "host:99999", "host:x", "*.10.0.0.1", "a..b", "-a.com", "a b.com", "*"} {
		_, err := ParseAllow(bad)
		require.ErrorIs(t, err, ErrBadPolicy, bad)
	}
}

func TestRuleMatching(t *testing.T) {
	suffix := Rule{Host: "*.github.com"}
	assert.True(t, suffix.matchesHost("api.github.com"))
	assert.False(t, suffix.matchesHost("github.com"), "a suffix rule does not cover the bare name")
	assert.False(t, suffix.matchesHost("evilgithub.com"))
	assert.True(t, suffix.matchesPort(443))
	assert.False(t, suffix.matchesPort(22), "no port means 80 and 443")
	lit := Rule{Host: "::ffff:127.0.0.1"}
	assert.True(t, lit.matchesHost("127.0.0.1"))
}

func TestParseCredential(t *testing.T) {
	c, err := ParseCredential(`host=api.github.com,header=Authorization,value-env=GH_TOKEN,format="Bearer %s"`)
	require.NoError(t, err)
	assert.Equal(t, Credential{Host: "api.github.com", Header: "Authorization", ValueEnv: "GH_TOKEN", Format: "Bearer %s"}, c)
	c, err = ParseCredential(`host=registry.npmjs.org,header=Authorization,value-file=/run/secrets/npm,format="Bearer, %s"`)
	require.NoError(t, err)
	assert.Equal(t, "Bearer, %s", c.Format)
	assert.Equal(t, "/run/secrets/npm", c.ValueFile)
	for _, bad := range []string{
		`host=api.github.com,header=Authorization`,                            // no value source
		`host=api.github.com,header=Authorization,value-env=A,value-file=/f`,  // two sources
		`host=*.github.com,header=Authorization,value-env=A`,                  // not one exact host
		`host=api.github.com,header=Host,value-env=A`,                         // a header that cannot carry it
		`host=api.github.com,header=Authorization,value-env=A,format="%s %s"`, // two %s
		`host=api.github.com,header=Authorization,value-env=A,format="Bearer`, // unterminated
		`host=api.github.com,header=Authorization,value-env=A,colour=blue`,    // unknown key
	} {
		_, err := ParseCredential(bad)
		require.ErrorIs(t, err, ErrBadPolicy, bad)
	}
}

func TestCredentialValueFromFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(f, []byte("s3cret\n"), 0o600))
	v, err := Credential{Host: "a.test", Header: "X", ValueFile: f, Format: "token %s"}.resolveValue(os.Getenv)
	require.NoError(t, err)
	assert.Equal(t, "token s3cret", v)
	require.NoError(t, os.WriteFile(f, []byte("a\nb"), 0o600))
	_, err = Credential{Host: "a.test", Header: "X", ValueFile: f}.resolveValue(os.Getenv)
	require.ErrorIs(t, err, ErrBadPolicy, "a line break could smuggle a header")
}

func TestLoadPolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{
	  "rules": [{"host": "api.github.com", "methods": ["GET"], "paths": ["/repos/"]}, {"host": "proxy.golang.org"}],
	  "credentials": [{"host": "api.github.com", "header": "Authorization", "value_env": "GH_TOKEN", "format": "Bearer %s"}],
	  "max_bytes": 1000000, "max_connections": 50}`), 0o644))
	p, err := LoadPolicy(good)
	require.NoError(t, err)
	assert.Len(t, p.Rules, 2)
	assert.Equal(t, 50, p.MaxConnections)

	for name, body := range map[string]string{
		"unknown.json":  `{"rules": [{"host": "a.test", "hots": 1}]}`,
		"orphan.json":   `{"rules": [{"host": "a.test"}], "credentials": [{"host": "b.test", "header": "X", "value_env": "E"}]}`,
		"method.json":   `{"rules": [{"host": "a.test", "methods": ["get"]}]}`,
		"path.json":     `{"rules": [{"host": "a.test", "paths": ["repos"]}]}`,
		"negative.json": `{"rules": [{"host": "a.test"}], "max_bytes": -1}`,
	} {
		f := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(f, []byte(body), 0o644))
		_, err := LoadPolicy(f)
		require.ErrorIs(t, err, ErrBadPolicy, name)
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(`{"rules": [{"host": "proxy.golang.org", "port": 443}], "max_connections": 3}`))
	require.NoError(t, err)
	assert.Equal(t, []Rule{{Host: "proxy.golang.org", Port: 443}}, p.Rules)
	assert.Equal(t, 3, p.MaxConnections)

	for name, body := range map[string]string{
		"not json": `{"rules": [`,
		"unknown":  `{"rulez": []}`,
		"invalid":  `{"rules": [{"host": "a.test", "methods": ["get"]}]}`,
	} {
		_, err := ParsePolicy([]byte(body))
		require.ErrorIs(t, err, ErrBadPolicy, name)
	}
}

func TestBuildPolicy(t *testing.T) {
	p, err := BuildPolicy("", nil, nil)
	require.NoError(t, err)
	assert.True(t, p.IsZero(), "no file and no flags: no proxy")

	f := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(f, []byte(`{"rules": [{"host": "proxy.golang.org"}], "max_connections": 9}`), 0o644))
	p, err = BuildPolicy(f, []string{"api.github.com:443"}, []string{`host=api.github.com,header=Authorization,value-env=GH_TOKEN,format="Bearer %s"`})
	require.NoError(t, err)
	assert.Equal(t, []Rule{{Host: "proxy.golang.org"}, {Host: "api.github.com", Port: 443}}, p.Rules)
	assert.Len(t, p.Credentials, 1)
	assert.Equal(t, 9, p.MaxConnections)

	_, err = BuildPolicy("", nil, []string{`host=api.github.com,header=Authorization,value-env=GH_TOKEN`})
	require.ErrorIs(t, err, ErrBadPolicy)
	assert.Contains(t, err.Error(), "--allow api.github.com:443", "the error names the fix")
}
