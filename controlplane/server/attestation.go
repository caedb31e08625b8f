package server

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/model"
)

// EnvelopeContentType is the media type of a DSSE envelope, as the
// attestation route answers it.
const EnvelopeContentType = "application/vnd.dsse.envelope.v1+json"

// handleAttestation answers the run's attestation: the DSSE envelope its
// worker stored in the shared store as attest.ObjectName, byte for byte.
// Another user's run is not found, as for every run call.
func (s *Server) handleAttestation(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	if s.cfg.Blobs == nil {
		writeError(w, http.StatusNotFound, "run "+run.ID+" has no attestation here: this control plane has no shared store (serve --store)")
		return
	}
	ref := model.RunRef{UserID: run.Task.UserID, ConversationID: run.Task.ConversationID, TaskID: run.Task.ID, RunID: run.ID}
	env, err := attest.ReadStored(r.Context(), s.cfg.Blobs, ref)
	switch {
	case errors.Is(err, attest.ErrNoEnvelope):
		writeError(w, http.StatusNotFound, "run "+run.ID+" has no attestation: it has not ended, ran before attestations, or never started a container")
		return
	case errors.Is(err, attest.ErrEnvelopeTooLarge):
		writeError(w, http.StatusBadGateway, err.Error())
		return
	case err != nil:
		if r.Context().Err() == nil {
			s.cfg.Log.Error("read attestation", "run", run.ID, "err", err)
		}
		writeError(w, http.StatusBadGateway, "the run's attestation could not be read from the shared store")
		return
	}
	w.Header().Set("Content-Type", EnvelopeContentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(env)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(env)
}
