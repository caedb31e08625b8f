package webui

import (
	"net/http"
	"strings"
)

// BasicAsBearer lets a browser authenticate with the control plane's bearer
// tokens: a request with HTTP Basic credentials has its password (the token;
// the user name is ignored) passed on to next as "Authorization: Bearer",
// and a request without any Authorization header is answered 401 with a
// Basic challenge, so the browser asks for the token. next does the actual
// authentication, exactly as for the API.
func BasicAsBearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, token, ok := r.BasicAuth(); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token)
		} else if r.Header.Get("Authorization") == "" {
			setSecureHeaders(w.Header())
			w.Header().Set("WWW-Authenticate", `Basic realm="taskrun", charset="UTF-8"`)
			http.Error(w, "sign in with your taskrun user token as the password", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// BrowserSignIn wraps a control plane's handler so that browsers can sign in
// to the interface it mounts under prefix (e.g. "/ui/"): requests under
// prefix go through BasicAsBearer, every other request reaches next
// unchanged.
func BrowserSignIn(next http.Handler, prefix string) http.Handler {
	ui := BasicAsBearer(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, prefix) {
			ui.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
