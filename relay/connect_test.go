package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConnectPipesStdinAndStdoutToALoopbackPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Echo upper-cased until the client half-closes, then say bye.
		b, _ := io.ReadAll(c)
		_, _ = c.Write([]byte(strings.ToUpper(string(b)) + "bye\n"))
	}()
	var out strings.Builder
	err = connect(context.Background(), ln.Addr().String(), strings.NewReader("hello\n"), &out)
	require.NoError(t, err)
	assert.Equal(t, "HELLO\nbye\n", out.String())
}

func TestConnectRefusesAnAddressOffLoopback(t *testing.T) {
	err := connect(context.Background(), "192.0.2.1:80", strings.NewReader(""), io.Discard)
	assert.ErrorIs(t, err, errBadUsage)
	_, err = parseOptions([]string{"-connect", "10.0.0.1:80"}, func(string) string { return "" })
	assert.ErrorIs(t, err, errBadUsage)
	_, err = parseOptions([]string{"-connect", "127.0.0.1:80", "--", "sh"}, func(string) string { return "" })
	assert.ErrorIs(t, err, errBadUsage)
	o, err := parseOptions([]string{"-connect", "127.0.0.1:80"}, func(string) string { return "" })
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:80", o.connect)
}

func TestConnectToNothingFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	err = connect(context.Background(), addr, bufio.NewReader(strings.NewReader("")), io.Discard)
	var op *net.OpError
	assert.True(t, errors.As(err, &op), "%v", err)
}
