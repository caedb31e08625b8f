package worker_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/egress"
	"github.com/taskrun/taskrun/model"
	"github.com/taskrun/taskrun/runlimits"
	"github.com/taskrun/taskrun/sandbox/sandboxfake"
	"github.com/taskrun/taskrun/worker"
	"github.com/taskrun/taskrun/workerclient"
)

// An assignment is a tenant's request: the worker checks it against its
// operator's configuration even when the control plane did not, and starts
// nothing for a refused one.

// refusedRun runs a as the only run of a worker configured by change and
// returns the reason it was refused with.
func refusedRun(t *testing.T, a workerclient.Assignment, change func(*worker.Config)) string {
	t.Helper()
	f := newFixture(t, sandboxfake.WithImages("fake/agent"))
	if change != nil {
		change(&f.cfg)
	}
	f.cp.Enqueue(a)
	_, stop := f.start(t)
	info := f.final(t, a.Run.ID)
	require.NoError(t, stop())
	assert.Equal(t, model.StatusFailed, info.Status, info.Reason)
	assert.Empty(t, f.b.Started(), "no container is started for a refused run")
	return info.Reason
}

func TestWorkerRefusesACredentialSourceFromTheControlPlane(t *testing.T) {
	t.Setenv("WORKER_TEST_SECRET", "s3cret")
	a := assignment("r1", "echo")
	a.Egress = json.RawMessage(`{"rules":[{"host":"a.example"}],"credentials":[{"host":"a.example","header":"Authorization","value_env":"WORKER_TEST_SECRET"}]}`)
	reason := refusedRun(t, a, func(c *worker.Config) {
		c.Egress = egress.Operator{Rules: []egress.Rule{{Host: "a.example"}}}
	})
	assert.Contains(t, reason, egress.ErrHostSecretNamed.Error())
	assert.NotContains(t, reason, "s3cret")
}

func TestWorkerRefusesASpecialAddressRule(t *testing.T) {
	a := assignment("r1", "echo")
	a.Egress = json.RawMessage(`{"rules":[{"host":"127.0.0.1","port":8080}]}`)
	reason := refusedRun(t, a, func(c *worker.Config) {
		// Even the operator's own rule for the address is not the tenant's.
		c.Egress = egress.Operator{Rules: []egress.Rule{{Host: "127.0.0.1", Port: 8080}}}
	})
	assert.Contains(t, reason, egress.ErrSpecialAddress.Error())
}

func TestWorkerRefusesEgressBeyondTheOperators(t *testing.T) {
	a := assignment("r1", "echo")
	a.Egress = json.RawMessage(`{"rules":[{"host":"evil.example"}]}`)
	reason := refusedRun(t, a, func(c *worker.Config) {
		c.Egress = egress.Operator{Rules: []egress.Rule{{Host: "api.github.com"}}}
	})
	assert.Contains(t, reason, "is within no rule of this host's (api.github.com)")

	a = assignment("r2", "echo")
	a.Egress = json.RawMessage(`{"rules":[{"host":"api.github.com"}]}`)
	reason = refusedRun(t, a, nil)
	assert.Contains(t, reason, "this host gives runs no network", "a worker without an operator policy grants no egress")
}

func TestWorkerRefusesLimitsOverItsMaxima(t *testing.T) {
	a := assignment("r1", "echo")
	a.Limits = workerclient.Limits{PIDs: 100000}
	reason := refusedRun(t, a, nil)
	assert.Contains(t, reason, "limits.pids 100000 is over the maximum 4096")
	assert.Contains(t, reason, "--"+runlimits.FlagPIDs)

	a = assignment("r2", "echo")
	a.Limits = workerclient.Limits{MemoryBytes: 2 << 30}
	reason = refusedRun(t, a, func(c *worker.Config) { c.RunMaxima = runlimits.Maxima{MemoryBytes: 1 << 30} })
	assert.Contains(t, reason, "--"+runlimits.FlagMemory)
}

func TestWorkerRunsWhatIsWithinItsMaxima(t *testing.T) {
	f := newFixture(t, sandboxfake.WithImages("fake/agent"))
	a := assignment("r1", "echo")
	a.Limits = workerclient.Limits{PIDs: 4096}
	f.cp.Enqueue(a)
	_, stop := f.start(t)
	info := f.final(t, "r1")
	require.NoError(t, stop())
	assert.Equal(t, model.StatusSucceeded, info.Status, info.Reason)
}

func TestWorkerNewRefusesADefaultOverItsMaximum(t *testing.T) {
	f := newFixture(t)
	f.buildHost(t)
	f.cfg.RunMaxima = runlimits.Maxima{PIDs: 100}
	_, err := worker.New(f.cfg)
	require.ErrorIs(t, err, runlimits.ErrOverMaximum)
	f.cfg.RunMaxima = runlimits.Maxima{}
	f.cfg.Egress = egress.Operator{Credentials: []egress.OperatorCredential{{ID: "x", Tenants: []string{"*"},
		Credential: egress.Credential{Host: "a.example", Header: "X", ValueEnv: "Y"}}}}
	_, err = worker.New(f.cfg)
	require.ErrorIs(t, err, egress.ErrBadPolicy, "a credential for a host no operator rule allows")
}
