package uidpool

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envHold makes the test binary a lease holder in another process:
// "DIR:UID" leases UID from a one-uid pool in DIR, prints "held", and waits.
const envHold = "UIDPOOL_TEST_HOLD"

func TestMain(m *testing.M) {
	if v := os.Getenv(envHold); v != "" {
		holdForever(v)
	}
	os.Exit(m.Run())
}

func holdForever(v string) {
	i := len(v) - 1
	for v[i] != ':' {
		i--
	}
	uid, _ := strconv.Atoi(v[i+1:])
	p, err := New(v[:i], Range{First: uid, Last: uid})
	if err == nil {
		_, err = p.Acquire(context.Background())
	}
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("held\n")
	select {}
}

// noProcesses is an inUse that sees no host process in the range.
func noProcesses(Range) (map[int]bool, error) { return map[int]bool{}, nil }

func newTestPool(t *testing.T, r Range) *Pool {
	t.Helper()
	p, err := New(t.TempDir(), r)
	require.NoError(t, err)
	p.inUse = noProcesses
	return p
}

func TestLeasesAreDistinctUntilExhausted(t *testing.T) {
	p := newTestPool(t, Range{First: 300000, Last: 300003})
	ctx := context.Background()
	seen := map[int]*Lease{}
	for range 4 {
		l, err := p.Acquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, l.UID, l.GID)
		assert.Equal(t, strconv.Itoa(l.UID)+":"+strconv.Itoa(l.UID), l.User())
		assert.NotContains(t, seen, l.UID, "uid %d leased twice", l.UID)
		assert.True(t, l.UID >= 300000 && l.UID <= 300003)
		seen[l.UID] = l
	}
	_, err := p.Acquire(ctx)
	require.ErrorIs(t, err, ErrExhausted)
	assert.Contains(t, err.Error(), "--uid-range")

	released := seen[300002]
	require.NoError(t, released.Release())
	require.NoError(t, released.Release(), "Release twice is harmless")
	l, err := p.Acquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, 300002, l.UID, "the released uid is the only free one")
}

func TestTwoPoolsOnOneDirShareLeases(t *testing.T) {
	dir := t.TempDir()
	r := Range{First: 300000, Last: 300001}
	a, err := New(dir, r)
	require.NoError(t, err)
	b, err := New(dir, r)
	require.NoError(t, err)
	a.inUse, b.inUse = noProcesses, noProcesses
	la, err := a.Acquire(context.Background())
	require.NoError(t, err)
	lb, err := b.Acquire(context.Background())
	require.NoError(t, err)
	assert.NotEqual(t, la.UID, lb.UID)
	_, err = a.Acquire(context.Background())
	assert.ErrorIs(t, err, ErrExhausted)
}

// A lease held by another process is never handed out, and the kernel
// releases it when that process dies without releasing (a crashed executor).
func TestLeaseIsExclusiveAcrossProcessesAndFreedOnCrash(t *testing.T) {
	dir := t.TempDir()
	const uid = 300007
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHold+"="+dir+":"+strconv.Itoa(uid))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", line)

	p, err := New(dir, Range{First: uid, Last: uid})
	require.NoError(t, err)
	p.inUse = noProcesses
	_, err = p.Acquire(context.Background())
	require.ErrorIs(t, err, ErrExhausted, "the other process holds the only uid")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	l, err := p.Acquire(context.Background())
	require.NoError(t, err, "the kernel dropped the crashed holder's lock")
	assert.Equal(t, uid, l.UID)
}

// A uid a live host process runs as is skipped even without a lease: the
// container of a crashed executor may still be running as it.
func TestUIDOfALiveProcessIsSkipped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("starts a process as another uid: needs root")
	}
	const uid = 300011
	sleeper := exec.Command("sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	require.NoError(t, sleeper.Start())
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })

	p, err := New(t.TempDir(), Range{First: uid, Last: uid + 1})
	require.NoError(t, err)
	l, err := p.Acquire(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uid+1, l.UID)
	_, err = p.Acquire(context.Background())
	assert.ErrorIs(t, err, ErrExhausted)
}

func TestParseRange(t *testing.T) {
	r, err := ParseRange("200000-265535")
	require.NoError(t, err)
	assert.Equal(t, DefaultRange(), r)
	assert.Equal(t, 65536, r.Len())
	assert.Equal(t, "200000-265535", r.String())
	for _, bad := range []string{"", "200000", "a-b", "5-4000", "300000-200000", "200000-5000000000"} {
		_, err := ParseRange(bad)
		assert.Error(t, err, bad)
	}
}

func TestAcquireHonoursCancel(t *testing.T) {
	p := newTestPool(t, DefaultRange())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Acquire(ctx)
	assert.ErrorIs(t, err, context.Canceled)
}
