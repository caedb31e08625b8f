package main

import (
	"log/slog"
	"net/http"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/webui"
)

// uiPrefix is where serve mounts the web interface.
const uiPrefix = "/ui/"

// serve mounts the read-only web interface (package webui) under /ui/,
// behind the user API's authentication: each user sees their own runs. A
// browser signs in with HTTP Basic, the user token as the password.
func init() {
	serveUI = func(r controlplane.RunReader, blobs *persist.Store, log *slog.Logger) (http.Handler, func(http.Handler) http.Handler, error) {
		ui, err := webui.New(&webui.ControlPlaneSource{Control: r, Store: blobs}, webui.Options{
			Base:   uiPrefix[:len(uiPrefix)-1],
			Logger: log,
			Tenant: func(r *http.Request) (string, bool) { return server.UserFromContext(r.Context()) },
		})
		if err != nil {
			return nil, nil, err
		}
		return ui, func(h http.Handler) http.Handler { return webui.BrowserSignIn(h, uiPrefix) }, nil
	}
}
