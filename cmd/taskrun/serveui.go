package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/server"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/sandbox"
	"github.com/taskrun/taskrun/webui"
)

// uiPrefix is where serve mounts the web interface.
const uiPrefix = "/ui/"

// serve mounts the web interface (package webui) under /ui/, behind the
// user API's authentication: each user sees their own runs, and submits
// tasks and cancels their runs through the user API. A browser signs in
// with HTTP Basic, the user token as the password.
func init() {
	serveUI = func(r controlplane.RunReader, blobs *persist.Store, keys []*attest.Verifier, log *slog.Logger,
		liveUsage func(context.Context, controlplane.Run) (*sandbox.Usage, error)) (http.Handler, func(http.Handler) http.Handler, error) {
		src := &webui.ControlPlaneSource{Control: r, Store: blobs, LiveUsage: liveUsage}
		if wr, ok := r.(controlplane.WorkerReader); ok {
			src.Workers = wr // the hosts page shows the workers' heartbeats
		}
		// The forms act through the user API, which is known once the
		// server is built: wrap receives its handler.
		actions := &webui.APIActions{}
		ui, err := webui.New(src, webui.Options{
			Actions:    actions,
			Base:       uiPrefix[:len(uiPrefix)-1],
			Logger:     log,
			Tenant:     func(r *http.Request) (string, bool) { return server.UserFromContext(r.Context()) },
			AttestKeys: keys,
		})
		if err != nil {
			return nil, nil, err
		}
		return ui, func(h http.Handler) http.Handler {
			actions.API = h
			return webui.BrowserSignIn(h, uiPrefix)
		}, nil
	}
}
