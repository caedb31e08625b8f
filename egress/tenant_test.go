package egress

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTenantCredentialSourcesAreRefusedWithOneMessage(t *testing.T) {
	existing := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(existing, []byte("s3cret\n"), 0o600))
	t.Setenv("TENANT_TEST_SECRET", "s3cret")
	var msgs []string
	for _, cred := range []string{
		`{"host":"a.example","header":"Authorization","value_env":"TENANT_TEST_SECRET"}`,
		`{"host":"a.example","header":"Authorization","value_env":"NO_SUCH_VARIABLE_ANYWHERE"}`,
		`{"host":"a.example","header":"Authorization","value_file":"` + existing + `"}`,
		`{"host":"a.example","header":"Authorization","value_file":"/no/such/file"}`,
		`{"host":"a.example","header":"Authorization","value_file":"/etc"}`,
		`{"id":"github","value_env":"TENANT_TEST_SECRET"}`,
		`"github"`,
	} {
		_, err := ParseTenantRequest([]byte(`{"rules":[{"host":"a.example"}],"credentials":[` + cred + `]}`))
		require.ErrorIs(t, err, ErrHostSecretNamed, cred)
		require.ErrorIs(t, err, ErrBadPolicy, cred)
		msgs = append(msgs, err.Error())
	}
	for _, m := range msgs {
		assert.Equal(t, msgs[0], m, "every refused credential gets the same message: nothing about the host leaks")
		assert.NotContains(t, m, existing)
		assert.NotContains(t, m, "s3cret")
	}
	assert.Contains(t, msgs[0], `{"id": "ID"}`, "the message names the fix")
}

func TestTenantSpecialAddressRulesAreRefused(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "169.254.169.254",
		"fe80::1", "100.64.0.1", "::ffff:127.0.0.1", "0.0.0.0", "fd00:ec2::254", "100.100.100.200"} {
		_, err := ParseTenantRequest([]byte(`{"rules":[{"host":"` + host + `","port":8080}]}`))
		require.ErrorIs(t, err, ErrSpecialAddress, host)
		// Grant checks again, whatever the caller parsed with.
		_, err = Operator{Rules: []Rule{{Host: host, Port: 8080}}}.Grant("alice", TenantRequest{Rules: []Rule{{Host: host, Port: 8080}}})
		require.ErrorIs(t, err, ErrSpecialAddress, host)
	}
	req, err := ParseTenantRequest([]byte(`{"rules":[{"host":"93.184.215.14"}]}`))
	require.NoError(t, err, "a public IP literal is a destination like any other")
	assert.Equal(t, "93.184.215.14", req.Rules[0].Host)
}

func TestParseTenantRequestShapes(t *testing.T) {
	for _, empty := range []string{"", "null", " "} {
		req, err := ParseTenantRequest([]byte(empty))
		require.NoError(t, err)
		assert.True(t, req.IsZero())
	}
	_, err := ParseTenantRequest([]byte(`{"rules":[],"surprise":1}`))
	require.ErrorIs(t, err, ErrBadPolicy)
	_, err = ParseTenantRequest([]byte(`{"rules":[{"host":"Bad Host"}]}`))
	require.ErrorIs(t, err, ErrBadPolicy)
	_, err = ParseTenantRequest([]byte(`{"rules":[],"max_bytes":-1}`))
	require.ErrorIs(t, err, ErrBadPolicy)
	req, err := ParseTenantRequest([]byte(`{"rules":[{"host":"api.github.com"}],"credentials":[{"id":"github"}]}`))
	require.NoError(t, err)
	assert.Equal(t, []CredentialRef{{ID: "github"}}, req.Credentials)
}

func TestGrantNarrowsTheOperatorsRules(t *testing.T) {
	op := Operator{Rules: []Rule{
		{Host: "api.github.com", Methods: []string{"GET", "POST"}, Paths: []string{"/repos/"}},
		{Host: "*.npmjs.org"},
		{Host: "proxy.example", Port: 443},
		{Host: "10.0.0.5", Port: 8080},
	}}
	for name, c := range map[string]struct {
		in, want Rule
	}{
		"same host takes the operator's limits": {Rule{Host: "api.github.com"}, Rule{Host: "api.github.com", Methods: []string{"GET", "POST"}, Paths: []string{"/repos/"}}},
		"narrower methods and paths":            {Rule{Host: "api.github.com", Port: 443, Methods: []string{"GET"}, Paths: []string{"/repos/x/"}}, Rule{Host: "api.github.com", Port: 443, Methods: []string{"GET"}, Paths: []string{"/repos/x/"}}},
		"a name under a suffix":                 {Rule{Host: "registry.npmjs.org"}, Rule{Host: "registry.npmjs.org"}},
		"a suffix under a suffix":               {Rule{Host: "*.cdn.npmjs.org"}, Rule{Host: "*.cdn.npmjs.org"}},
		"standard ports narrowed to the one":    {Rule{Host: "proxy.example"}, Rule{Host: "proxy.example", Port: 443}},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := op.Grant("alice", TenantRequest{Rules: []Rule{c.in}})
			require.NoError(t, err)
			require.Len(t, p.Rules, 1)
			assert.Equal(t, c.want, p.Rules[0])
			assert.Equal(t, DefaultMaxBytes, p.MaxBytes)
		})
	}
	for name, in := range map[string]Rule{
		"another host":            {Host: "evil.example"},
		"the suffix itself":       {Host: "npmjs.org"},
		"a wider suffix":          {Host: "*.org"},
		"another port":            {Host: "api.github.com", Port: 8443},
		"a method not allowed":    {Host: "api.github.com", Methods: []string{"DELETE"}},
		"a path outside":          {Host: "api.github.com", Paths: []string{"/user"}},
		"port 80 of a 443 rule":   {Host: "proxy.example", Port: 80},
		"a name under an address": {Host: "x.10.0.0.5"},
	} {
		t.Run("refused: "+name, func(t *testing.T) {
			_, err := op.Grant("alice", TenantRequest{Rules: []Rule{in}})
			require.ErrorIs(t, err, ErrNotGranted)
			assert.Contains(t, err.Error(), "is within no rule of this host's")
		})
	}
	_, err := op.Grant("alice", TenantRequest{Rules: []Rule{{Host: "10.0.0.5", Port: 8080}}})
	require.ErrorIs(t, err, ErrSpecialAddress, "an operator's rule for a private address is the operator's own")
}

func TestGrantWithoutAnOperatorPolicyGivesNoNetwork(t *testing.T) {
	p, err := Operator{}.Grant("alice", TenantRequest{})
	require.NoError(t, err)
	assert.True(t, p.IsZero(), "asking nothing gets nothing")
	_, err = Operator{}.Grant("alice", TenantRequest{Rules: []Rule{{Host: "api.github.com"}}})
	require.ErrorIs(t, err, ErrNotGranted)
	assert.Contains(t, err.Error(), "--allow")
}

func TestGrantCredentialsByIDForTheirTenantsOnly(t *testing.T) {
	gh := OperatorCredential{ID: "github", Tenants: []string{"alice"}, Credential: Credential{Host: "api.github.com", Header: "Authorization", ValueEnv: "GH_TOKEN"}}
	npm := OperatorCredential{ID: "npm", Tenants: []string{"*"}, Credential: Credential{Host: "registry.npmjs.org", Header: "Authorization", ValueFile: "/etc/npm-token"}}
	op := Operator{Rules: []Rule{{Host: "api.github.com"}, {Host: "*.npmjs.org"}}, Credentials: []OperatorCredential{gh, npm}}
	require.NoError(t, op.Validate())
	req := TenantRequest{Rules: []Rule{{Host: "api.github.com"}, {Host: "registry.npmjs.org"}}, Credentials: []CredentialRef{{ID: "github"}, {ID: "npm"}}}
	p, err := op.Grant("alice", req)
	require.NoError(t, err)
	ghGranted, npmGranted := gh.Credential, npm.Credential
	ghGranted.ID, npmGranted.ID = "github", "npm"
	assert.Equal(t, []Credential{ghGranted, npmGranted}, p.Credentials, "each names the grant it came from")

	_, errOther := op.Grant("bob", req)
	require.ErrorIs(t, errOther, ErrNotGranted, "github is alice's")
	_, errNone := op.Grant("bob", TenantRequest{Rules: req.Rules, Credentials: []CredentialRef{{ID: "nosuch"}}})
	require.ErrorIs(t, errNone, ErrNotGranted)
	assert.Contains(t, errOther.Error(), "no credential of that id is configured for you")
	assert.Contains(t, errNone.Error(), "no credential of that id is configured for you", "another tenant's id and no id answer alike")
}

func TestGrantBudgetsAreAtMostTheOperators(t *testing.T) {
	op := Operator{Rules: []Rule{{Host: "a.example"}}, MaxBytes: 1 << 20, MaxConnections: 10}
	p, err := op.Grant("alice", TenantRequest{Rules: []Rule{{Host: "a.example"}}, MaxBytes: 1000})
	require.NoError(t, err)
	assert.Equal(t, int64(1000), p.MaxBytes)
	assert.Equal(t, 10, p.MaxConnections)
	_, err = op.Grant("alice", TenantRequest{Rules: []Rule{{Host: "a.example"}}, MaxBytes: 1 << 30})
	require.ErrorIs(t, err, ErrNotGranted)
	_, err = op.Grant("alice", TenantRequest{Rules: []Rule{{Host: "a.example"}}, MaxConnections: 11})
	require.ErrorIs(t, err, ErrNotGranted)
}

func TestParseOperatorCredentialAndBuildOperator(t *testing.T) {
	c, err := ParseOperatorCredential(`id=github,tenants="alice bob",host=api.github.com,header=Authorization,value-env=GH_TOKEN,format="Bearer %s"`)
	require.NoError(t, err)
	assert.Equal(t, OperatorCredential{ID: "github", Tenants: []string{"alice", "bob"},
		Credential: Credential{Host: "api.github.com", Header: "Authorization", ValueEnv: "GH_TOKEN", Format: "Bearer %s"}}, c)
	_, err = ParseOperatorCredential(`host=api.github.com,header=Authorization,value-env=GH_TOKEN,tenants=*`)
	require.ErrorIs(t, err, ErrBadPolicy, "an id is required")
	_, err = ParseOperatorCredential(`id=gh,host=api.github.com,header=Authorization,value-env=GH_TOKEN`)
	require.ErrorIs(t, err, ErrBadPolicy, "the tenants are required")

	o, err := BuildOperator("", []string{"api.github.com"}, []string{`id=gh,tenants=*,host=api.github.com,header=Authorization,value-env=GH_TOKEN`})
	require.NoError(t, err)
	assert.Len(t, o.Credentials, 1)
	_, err = BuildOperator("", []string{"api.github.com"}, []string{`id=gh,tenants=*,host=api.github.com,header=A,value-env=X`, `id=gh,tenants=*,host=api.github.com,header=B,value-env=Y`})
	require.ErrorIs(t, err, ErrBadPolicy, "an id is given once")
	f := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(f, []byte(`{"rules":[{"host":"a.example"}],"credentials":[{"host":"a.example","header":"X","value_env":"Y"}]}`), 0o600))
	_, err = BuildOperator(f, nil, nil)
	require.ErrorIs(t, err, ErrBadPolicy, "a file's credentials have no id")
	o, err = BuildOperator("", nil, nil)
	require.NoError(t, err)
	assert.Empty(t, o.Rules)
}
