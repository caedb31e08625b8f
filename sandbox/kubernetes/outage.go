package kubernetes

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/taskrun/taskrun/internal/backoff"
)

// DefaultAPIOutage is how long the backend keeps retrying a call the API
// server does not answer (connection refused or reset, no response) before
// it gives up with ErrAPIServerUnreachable.
const DefaultAPIOutage = 2 * time.Minute

// apiCallTimeout bounds one attempt of a retried call: a stopped API server
// accepts connections (the kernel does) but never answers.
const apiCallTimeout = 10 * time.Second

// apiBackoff spaces the attempts of a call during an outage.
var apiBackoff = backoff.Exponential{Initial: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: true}

// ErrAPIServerUnreachable is wrapped when the API server did not answer
// for longer than the backend's outage bound (WithAPIOutage), or until the
// call's deadline.
var ErrAPIServerUnreachable = errors.New("kubernetes API server unreachable")

// unanswered reports whether err means the API server did not answer, or
// answered that it cannot serve now, as opposed to an answer about the
// request (not found, forbidden, invalid), which no retry changes, or a
// failure on the executor's side that no retry changes either (the server's
// certificate not verified, a request that cannot be encoded).
func unanswered(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		// 429, 500, 503 and 504 (the server's timeouts), and a 502 from a
		// proxy in front of it.
		return apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) ||
			apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			status.Status().Code == http.StatusBadGateway
	}
	if permanent(err) {
		return false
	}
	// Connection refused or reset, no response within the attempt's
	// timeout, a TLS handshake timeout, a connection lost or sent away
	// (HTTP/2 GOAWAY) by a restarting server: nothing came back.
	return true
}

// permanent reports whether err, which carries no answer of the API server,
// is one that retrying cannot change: the server's certificate or name did
// not verify against the kubeconfig, or the request could not be made.
func permanent(err error) bool {
	var (
		unknownCA   x509.UnknownAuthorityError
		invalidCert x509.CertificateInvalidError
		hostname    x509.HostnameError
		verify      *tls.CertificateVerificationError
		tlsRecord   tls.RecordHeaderError
		badHost     url.InvalidHostError
	)
	return errors.As(err, &unknownCA) || errors.As(err, &invalidCert) || errors.As(err, &hostname) ||
		errors.As(err, &verify) || errors.As(err, &tlsRecord) || errors.As(err, &badHost) || runtime.IsNotRegisteredError(err)
}

// retryAPI calls f until it returns nil or an answer from the API server,
// retrying with a bounded backoff while the server does not answer (each
// attempt bounded by apiCallTimeout). It gives up, with an error wrapping
// ErrAPIServerUnreachable that names the server and the fix, once the
// server has not answered for the backend's outage bound or ctx ends.
func (b *Backend) retryAPI(ctx context.Context, what string, f func(context.Context) error) error {
	var since time.Time
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, apiCallTimeout)
		err := f(actx)
		cancel()
		if !unanswered(err) {
			if !since.IsZero() {
				b.log.Info("kubernetes API server answers again", "server", b.config.Host, "call", what, "outage", time.Since(since).Round(time.Millisecond))
			}
			return err
		}
		if since.IsZero() {
			since = time.Now()
			b.log.Warn("kubernetes API server does not answer; retrying", "server", b.config.Host, "call", what, "err", err, "bound", b.apiOutage)
		}
		out := time.Since(since)
		if ctx.Err() != nil || out >= b.apiOutage {
			return b.unreachable(what, out, errors.Join(err, context.Cause(ctx)))
		}
		select {
		case <-ctx.Done():
			return b.unreachable(what, time.Since(since), errors.Join(err, context.Cause(ctx)))
		case <-time.After(min(apiBackoff.Delay(n), b.apiOutage-out)):
		}
	}
}

// unreachable is the error of a call the API server did not answer for d.
func (b *Backend) unreachable(what string, d time.Duration, err error) error {
	return fmt.Errorf("%w: %s did not answer %s for %s: %w; check that kube-apiserver is running and reachable from the executor (--kubeconfig); the run's Pod is left for the reaper",
		ErrAPIServerUnreachable, b.config.Host, what, d.Round(time.Millisecond), err)
}

// createRetried runs create, a Create call, under retryAPI. When an attempt
// went unanswered, the object may have been created all the same: an
// AlreadyExists answer to a later attempt is then success (the backend's
// names are random, so the object is the one this call created).
func (b *Backend) createRetried(ctx context.Context, what string, create func(context.Context) error) error {
	unansweredBefore := false
	return b.retryAPI(ctx, what, func(ctx context.Context) error {
		err := create(ctx)
		if unansweredBefore && apierrors.IsAlreadyExists(err) {
			return nil
		}
		if unanswered(err) {
			unansweredBefore = true
		}
		return err
	})
}

// getPod reads the named Pod, riding out an API server outage (retryAPI).
func (b *Backend) getPod(ctx context.Context, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := b.retryAPI(ctx, "get pod "+name, func(ctx context.Context) error {
		var err error
		pod, err = b.client.pods(b.namespace).Get(ctx, name)
		return err
	})
	return pod, err
}
