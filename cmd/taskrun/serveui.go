package main

import (
	"log/slog"
	"net/http"

	"github.com/taskrun/taskrun/attest"
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
	serveUI = func(r controlplane.RunReader, blobs *persist.Store, keys []*attest.Verifier, log *slog.Logger) (http.Handler, func(http.Handler) http.Handler, error) {
		src := &webui.ControlPlaneSource{Control: r, Store: blobs}
		if wr, ok := r.(controlplane.WorkerReader); ok {
			src.Workers = wr // the hosts page shows the workers' heartbeats
		}
		ui, err := webui.New(src, webui.Options{
			Base:       uiPrefix[:len(uiPrefix)-1],
			Logger:     log,
			Tenant:     func(r *http.Request) (string, bool) { return server.UserFromContext(r.Context()) },
			AttestKeys: keys,
		})
		if err != nil {
			return nil, nil, err
		}
		return ui, func(h http.Handler) http.Handler { return webui.BrowserSignIn(h, uiPrefix) }, nil
	}
}
