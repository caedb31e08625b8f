package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// On a shared host (taskrun worker) egress comes from two kinds of input:
//
//   - the operator's configuration (Operator): the rules runs may use, the
//     credentials brokered for which tenants, the byte and connection
//     budgets; read from the worker's flags and files;
//   - a tenant's request (TenantRequest): the egress a submission asks
//     for. It can only narrow the operator's rules, never reach a
//     loopback, private, link-local or metadata address, and names a
//     credential only by the ID the operator gave it for that tenant.
//
// Operator.Grant turns a tenant's request into the run's Policy.

// Errors of the tenant boundary, wrapped with ErrBadPolicy.
var (
	// ErrHostSecretNamed: a tenant's request names a credential's source
	// (value_env, value_file) or spells a credential out, instead of naming
	// one the operator configured by its ID.
	ErrHostSecretNamed = errors.New("a submission names a credential only by the id its operator configured")
	// ErrSpecialAddress: a tenant's rule names a loopback, private,
	// link-local, metadata or other special address.
	ErrSpecialAddress = errors.New("a submission's egress cannot reach loopback, private, link-local or metadata addresses")
	// ErrNotGranted: the request asks for more than the operator's policy.
	ErrNotGranted = errors.New("the egress asked for is not within this host's egress policy")
)

// hostSecretMessage is the one refusal of a credential that is not a bare
// ID. It never depends on what the request named, so it tells nothing about
// the host (no file-existence oracle).
const hostSecretMessage = `egress credentials: %w: write {"id": "ID"} with an id the operator gave you; value_env, value_file, host, header and format are refused`

// TenantRequest is the egress a tenant's submission asks for (the "egress"
// field of a task). Unknown fields are refused.
type TenantRequest struct {
	// Rules are the destinations asked for; each must be within a rule of
	// the operator's.
	Rules []Rule `json:"rules"`
	// Credentials name credentials the operator configured for the tenant.
	Credentials []CredentialRef `json:"credentials,omitempty"`
	// MaxBytes and MaxConnections lower the operator's budgets; 0 keeps them.
	MaxBytes       int64 `json:"max_bytes,omitempty"`
	MaxConnections int   `json:"max_connections,omitempty"`
}

// CredentialRef names an operator's credential by its ID.
type CredentialRef struct {
	// ID is the operator's name for the credential.
	ID string `json:"id"`
}

// UnmarshalJSON accepts only {"id": "..."}: any other key, a credential's
// source above all, is refused with one message that echoes nothing.
func (c *CredentialRef) UnmarshalJSON(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return fmt.Errorf(hostSecretMessage, ErrHostSecretNamed)
	}
	for k := range m {
		if k != "id" {
			return fmt.Errorf(hostSecretMessage, ErrHostSecretNamed)
		}
	}
	if err := json.Unmarshal(m["id"], &c.ID); err != nil || validCredentialID(c.ID) != nil {
		return fmt.Errorf(hostSecretMessage, ErrHostSecretNamed)
	}
	return nil
}

// IsZero reports whether the request asks for no egress at all.
func (t TenantRequest) IsZero() bool { return len(t.Rules) == 0 && len(t.Credentials) == 0 }

// ParseTenantRequest decodes and checks a submission's egress JSON on its
// own: its shape, each rule, no special address and no credential source.
// Empty data or JSON null is the zero request (no network). Whether the
// request is within a host's policy is Operator.Grant's to say.
func ParseTenantRequest(data []byte) (TenantRequest, error) {
	var t TenantRequest
	if len(bytes.TrimSpace(data)) == 0 || string(bytes.TrimSpace(data)) == "null" {
		return t, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		if errors.Is(err, ErrHostSecretNamed) {
			return TenantRequest{}, fmt.Errorf("%w: %w", ErrBadPolicy, err)
		}
		return TenantRequest{}, fmt.Errorf("%w: egress: %w (rules, credentials by id, max_bytes, max_connections)", ErrBadPolicy, err)
	}
	if err := t.check(); err != nil {
		return TenantRequest{}, err
	}
	return t, nil
}

// check validates every rule, refuses special addresses and negative budgets.
func (t TenantRequest) check() error {
	for i, r := range t.Rules {
		if err := r.validate(); err != nil {
			return fmt.Errorf("egress rule %d: %w", i+1, err)
		}
		if a, err := netip.ParseAddr(r.Host); err == nil {
			if class := addressClass(a); class != "" {
				return fmt.Errorf("%w: egress rule %d: %w: %s is %s; name a public host", ErrBadPolicy, i+1, ErrSpecialAddress, r.Host, class)
			}
		}
	}
	for i, c := range t.Credentials {
		if err := validCredentialID(c.ID); err != nil {
			return fmt.Errorf("%w: egress credential %d: %w", ErrBadPolicy, i+1, err)
		}
	}
	if t.MaxBytes < 0 || t.MaxConnections < 0 {
		return fmt.Errorf("%w: egress: max_bytes and max_connections must not be negative", ErrBadPolicy)
	}
	return nil
}

// validCredentialID accepts 1 to 64 letters, digits, '-', '_' and '.'.
func validCredentialID(id string) error {
	if id == "" || len(id) > 64 || strings.ContainsFunc(id, func(c rune) bool {
		return (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.'
	}) {
		return errors.New(`a credential id is 1 to 64 letters, digits, "-", "_" or "."`)
	}
	return nil
}

// OperatorCredential is a credential the operator configured and the
// tenants allowed to name it.
type OperatorCredential struct {
	// ID is what a tenant's request names.
	ID string
	// Tenants are the user IDs that may name it; "*" is every tenant.
	Tenants []string
	// Credential is where the value is read on the host and where it goes.
	Credential
}

// allows reports whether tenant may name the credential.
func (c OperatorCredential) allows(tenant string) bool {
	return slices.Contains(c.Tenants, "*") || slices.Contains(c.Tenants, tenant)
}

// Operator is a shared host's egress configuration: the most any run may
// reach, and the credentials tenants may name. The zero Operator grants no
// egress: every run has no network, and a request for any is refused.
type Operator struct {
	// Rules bound every run's rules. A rule naming a special IP literal is
	// the operator's own and is never granted to a tenant.
	Rules []Rule
	// Credentials are brokered only for the tenants each names.
	Credentials []OperatorCredential
	// MaxBytes and MaxConnections are each run's budgets (0: the defaults).
	MaxBytes       int64
	MaxConnections int
}

// Validate checks the operator's rules and credentials.
func (o Operator) Validate() error {
	p := Policy{Rules: o.Rules, MaxBytes: o.MaxBytes, MaxConnections: o.MaxConnections}
	for _, c := range o.Credentials {
		p.Credentials = append(p.Credentials, c.Credential)
	}
	if err := p.Validate(); err != nil {
		return err
	}
	for i, c := range o.Credentials {
		if err := validCredentialID(c.ID); err != nil {
			return fmt.Errorf("%w: credential %d: %w", ErrBadPolicy, i+1, err)
		}
		if len(c.Tenants) == 0 {
			return fmt.Errorf("%w: credential %s: name the tenants that may use it (tenants=USER, or tenants=* for all)", ErrBadPolicy, c.ID)
		}
		if slices.ContainsFunc(o.Credentials[:i], func(d OperatorCredential) bool { return d.ID == c.ID }) {
			return fmt.Errorf("%w: credential id %s is given twice", ErrBadPolicy, c.ID)
		}
	}
	return nil
}

// Grant turns tenant's request into the run's policy: each rule narrowed
// to a rule of the operator's, the credentials the operator configured for
// tenant, the budgets at most the operator's. The zero request gets the
// zero policy (no network). Anything more than the operator allows is
// refused, never widened or silently dropped.
func (o Operator) Grant(tenant string, req TenantRequest) (Policy, error) {
	if err := req.check(); err != nil {
		return Policy{}, err
	}
	if req.IsZero() {
		return Policy{}, nil
	}
	if len(o.Rules) == 0 {
		return Policy{}, fmt.Errorf("%w: %w: this host gives runs no network (its operator opens egress with taskrun worker --allow or --egress-policy)", ErrBadPolicy, ErrNotGranted)
	}
	var p Policy
	for i, t := range req.Rules {
		r, ok := o.narrow(t)
		if !ok {
			return Policy{}, fmt.Errorf("%w: %w: egress rule %d (%s) is within no rule of this host's (%s)", ErrBadPolicy, ErrNotGranted, i+1, t, o.ruleList())
		}
		p.Rules = append(p.Rules, r)
	}
	for _, ref := range req.Credentials {
		i := slices.IndexFunc(o.Credentials, func(c OperatorCredential) bool { return c.ID == ref.ID && c.allows(tenant) })
		if i < 0 {
			// The same answer whether the ID exists for another tenant or not at all.
			return Policy{}, fmt.Errorf("%w: %w: credential %q: no credential of that id is configured for you on this host", ErrBadPolicy, ErrNotGranted, ref.ID)
		}
		c := o.Credentials[i].Credential
		c.ID = o.Credentials[i].ID
		p.Credentials = append(p.Credentials, c)
	}
	p.MaxBytes = cmpOr(o.MaxBytes, DefaultMaxBytes)
	if req.MaxBytes > p.MaxBytes {
		return Policy{}, fmt.Errorf("%w: %w: egress max_bytes %d is over this host's budget of %d", ErrBadPolicy, ErrNotGranted, req.MaxBytes, p.MaxBytes)
	}
	p.MaxConnections = cmpOr(o.MaxConnections, DefaultMaxConnections)
	if req.MaxConnections > p.MaxConnections {
		return Policy{}, fmt.Errorf("%w: %w: egress max_connections %d is over this host's budget of %d", ErrBadPolicy, ErrNotGranted, req.MaxConnections, p.MaxConnections)
	}
	p.MaxBytes = cmpOr(req.MaxBytes, p.MaxBytes)
	p.MaxConnections = cmpOr(req.MaxConnections, p.MaxConnections)
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

func cmpOr[T int | int64](a, b T) T {
	if a != 0 {
		return a
	}
	return b
}

// ruleList names the operator's rules for an error.
func (o Operator) ruleList() string {
	names := make([]string, len(o.Rules))
	for i, r := range o.Rules {
		names[i] = r.String()
	}
	return strings.Join(names, "; ")
}

// narrow returns t narrowed to the first operator rule that holds it.
func (o Operator) narrow(t Rule) (Rule, bool) {
	for _, op := range o.Rules {
		if r, ok := op.narrow(t); ok {
			return r, true
		}
	}
	return Rule{}, false
}

// narrow returns t within o: t's host, the ports both allow, t's methods
// and paths (each within o's), or o's when t sets none.
func (o Rule) narrow(t Rule) (Rule, bool) {
	if !o.holdsHost(t.Host) {
		return Rule{}, false
	}
	r := Rule{Host: t.Host, Port: t.Port}
	switch {
	case o.Port == 0 && (t.Port == 0 || t.Port == 80 || t.Port == 443):
	case o.Port == t.Port:
	case t.Port == 0 && (o.Port == 80 || o.Port == 443):
		r.Port = o.Port
	default:
		return Rule{}, false
	}
	r.Methods = t.Methods
	if len(o.Methods) > 0 {
		if len(t.Methods) == 0 {
			r.Methods = slices.Clone(o.Methods)
		} else if slices.ContainsFunc(t.Methods, func(m string) bool { return !slices.Contains(o.Methods, m) }) {
			return Rule{}, false
		}
	}
	r.Paths = t.Paths
	if len(o.Paths) > 0 {
		if len(t.Paths) == 0 {
			r.Paths = slices.Clone(o.Paths)
		} else if slices.ContainsFunc(t.Paths, func(p string) bool {
			return !slices.ContainsFunc(o.Paths, func(q string) bool { return strings.HasPrefix(p, q) })
		}) {
			return Rule{}, false
		}
	}
	return r, true
}

// holdsHost reports whether every destination host names is one o allows:
// an IP literal only by the same literal, a name by the same name or a
// suffix pattern above it, a suffix pattern by a pattern above it.
func (o Rule) holdsHost(host string) bool {
	a, aErr := netip.ParseAddr(o.Host)
	b, bErr := netip.ParseAddr(host)
	switch {
	case aErr == nil || bErr == nil:
		return aErr == nil && bErr == nil && a.Unmap() == b.Unmap()
	case o.Host == host:
		return true
	}
	suffix, ok := strings.CutPrefix(o.Host, "*.")
	return ok && strings.HasSuffix(host, "."+suffix)
}

// ParseOperatorCredential parses a taskrun worker --credential value: the
// keys of ParseCredential plus id= (what tenants name) and tenants= (the
// user IDs that may name it, space-separated when quoted, repeatable; "*"
// for every tenant), e.g.
//
//	id=github,tenants="alice bob",host=api.github.com,header=Authorization,value-env=GH_TOKEN,format="Bearer %s"
func ParseOperatorCredential(s string) (OperatorCredential, error) {
	fields, err := splitPairs(s)
	if err != nil {
		return OperatorCredential{}, fmt.Errorf("%w: --credential %q: %w", ErrBadPolicy, s, err)
	}
	var oc OperatorCredential
	var rest [][2]string
	for _, kv := range fields {
		switch kv[0] {
		case "id":
			oc.ID = kv[1]
		case "tenants", "tenant":
			oc.Tenants = append(oc.Tenants, strings.Fields(kv[1])...)
		default:
			rest = append(rest, kv)
		}
	}
	if err := validCredentialID(oc.ID); err != nil {
		return OperatorCredential{}, fmt.Errorf("%w: --credential: id=: %w", ErrBadPolicy, err)
	}
	if len(oc.Tenants) == 0 {
		return OperatorCredential{}, fmt.Errorf("%w: --credential %s: give tenants=USER (or tenants=* for every tenant)", ErrBadPolicy, oc.ID)
	}
	if oc.Credential, err = credentialFromPairs(rest); err != nil {
		return OperatorCredential{}, fmt.Errorf("credential %s: %w", oc.ID, err)
	}
	return oc, nil
}

// BuildOperator builds a shared host's egress configuration from a policy
// file (empty for none: its rules and budgets; credentials are given with
// ids by the --credential flags instead), --allow and --credential values.
// No file and no flags give the zero Operator: runs have no network.
func BuildOperator(file string, allows, credentials []string) (Operator, error) {
	var o Operator
	if file != "" {
		p, err := LoadPolicy(file)
		if err != nil {
			return Operator{}, err
		}
		if len(p.Credentials) > 0 {
			return Operator{}, fmt.Errorf("%w: %s: a host's credentials need an id and their tenants: give each with --credential id=ID,tenants=USER,host=HOST,header=NAME,value-env=VAR", ErrBadPolicy, file)
		}
		o = Operator{Rules: p.Rules, MaxBytes: p.MaxBytes, MaxConnections: p.MaxConnections}
	}
	for _, a := range allows {
		r, err := ParseAllow(a)
		if err != nil {
			return Operator{}, err
		}
		o.Rules = append(o.Rules, r)
	}
	for _, s := range credentials {
		c, err := ParseOperatorCredential(s)
		if err != nil {
			return Operator{}, err
		}
		o.Credentials = append(o.Credentials, c)
	}
	if err := o.Validate(); err != nil {
		return Operator{}, err
	}
	return o, nil
}
