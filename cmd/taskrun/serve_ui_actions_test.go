package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	neturl "net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/webui"
)

// TestServeUISubmitAndCancel: taskrun serve's web interface submits a task
// and cancels it through the user API, as the signed-in user; bob cannot
// cancel alice's run, and a form without the token does nothing.
func TestServeUISubmitAndCancel(t *testing.T) {
	url, _ := startServe(t)
	browser := func(token string) (*http.Client, string) {
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		code, _ := uiDo(t, c, http.MethodGet, url+"/ui/submit", token, nil)
		require.Equal(t, http.StatusOK, code)
		u, err := neturl.Parse(url + "/ui/")
		require.NoError(t, err)
		for _, ck := range jar.Cookies(u) {
			if ck.Name == webui.CSRFCookie {
				return c, ck.Value
			}
		}
		t.Fatal("no token cookie")
		return nil, ""
	}
	alice, tok := browser(testUserToken)
	code, _ := uiDo(t, alice, http.MethodPost, url+"/ui/submit", testUserToken, neturl.Values{"prompt": {"hi"}})
	assert.Equal(t, http.StatusForbidden, code, "no token")
	code, _ = uiDo(t, alice, http.MethodPost, url+"/ui/submit", testUserToken, neturl.Values{"csrf": {tok}, "prompt": {"hi"}, "image": {"alpine:3"}})
	require.Equal(t, http.StatusSeeOther, code)

	runs := func() []controlplane.Run {
		_, body := get(t, url, "/v1/runs", testUserToken)
		var l controlplane.RunList
		require.NoError(t, json.Unmarshal([]byte(body), &l), body)
		return l.Runs
	}
	list := runs()
	require.Len(t, list, 1)
	id := list[0].ID
	assert.Equal(t, "alice", list[0].Task.UserID)

	bob, bobTok := browser(testOtherUserToken)
	code, _ = uiDo(t, bob, http.MethodPost, url+"/ui/runs/"+id+"/cancel", testOtherUserToken, neturl.Values{"csrf": {bobTok}})
	assert.Equal(t, http.StatusNotFound, code, "another user's run")
	assert.Equal(t, "QUEUED", string(runs()[0].Status))

	code, _ = uiDo(t, alice, http.MethodPost, url+"/ui/runs/"+id+"/cancel", testUserToken, neturl.Values{"csrf": {tok}})
	require.Equal(t, http.StatusSeeOther, code)
	assert.Equal(t, "CANCELLED", string(runs()[0].Status))
}

// uiDo sends a request as the user of token, a form as from the interface's
// own pages.
func uiDo(t *testing.T, c *http.Client, method, target, token string, form neturl.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.SetBasicAuth("x", token)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		u, _ := neturl.Parse(target)
		req.Header.Set("Origin", u.Scheme+"://"+u.Host)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
