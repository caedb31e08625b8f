package webui

import (
	"net/http"
	"strings"
)

// BasicAsBearer lets a browser authenticate with the control plane's bearer
// tokens: a request with HTTP Basic credentials has its password (the token;
// the user name is ignored) passed on to next as "Authorization: Bearer",
// and a request without any Authorization header is answered 401 with a
// Basic challenge, so the browser asks for the token; so is every 401 of
// next (a wrong token), so the browser asks again. next does the actual
// authentication, exactly as for the API.
func BasicAsBearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, token, ok := r.BasicAuth(); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token)
		} else if r.Header.Get("Authorization") == "" {
			setSecureHeaders(w.Header())
			w.Header().Set("WWW-Authenticate", basicRealm)
			http.Error(w, "sign in with your taskrun user token as the password", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(basicChallenge{w}, r)
	})
}

const basicRealm = `Basic realm="taskrun", charset="UTF-8"`

// basicChallenge turns a 401's challenge into a Basic one.
type basicChallenge struct{ http.ResponseWriter }

func (b basicChallenge) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		b.Header().Set("WWW-Authenticate", basicRealm)
	}
	b.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer (flushing
// server-sent events).
func (b basicChallenge) Unwrap() http.ResponseWriter { return b.ResponseWriter }

// Flush flushes the underlying writer, for server-sent events.
func (b basicChallenge) Flush() {
	if f, ok := b.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
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
