package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
)

// ErrUpstream is wrapped by every UpstreamError.
var ErrUpstream = errors.New("model upstream failed")

// UpstreamError says the model upstream is misconfigured or down: it
// answered 401, 403, 404 or 5xx, or could not be reached. The agent is only
// told that the upstream failed, never where it is.
type UpstreamError struct {
	// Status is the HTTP status the upstream answered; 0 when it was not reached.
	Status int
	// Err is why the upstream was not reached; nil when it answered.
	Err error
}

// Error reads "model upstream answered 401 Unauthorized" or "model upstream
// unreachable: ...".
func (e *UpstreamError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("model upstream answered %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("model upstream unreachable: %v", e.Err)
}

// Is makes errors.Is(err, ErrUpstream) true.
func (e *UpstreamError) Is(target error) bool { return target == ErrUpstream }

// Unwrap returns why the upstream was not reached, if it was not.
func (e *UpstreamError) Unwrap() error { return e.Err }

// Misconfigured reports whether the operator must fix the model's
// configuration (key, base URL or model name): the upstream answered 401,
// 403 or 404. Retrying cannot help.
func (e *UpstreamError) Misconfigured() bool {
	return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden || e.Status == http.StatusNotFound
}

// upstreamFailure classifies an upstream answer: nil unless it says the
// upstream is misconfigured or down.
func upstreamFailure(status int) *UpstreamError {
	switch {
	case status == http.StatusUnauthorized, status == http.StatusForbidden, status == http.StatusNotFound, status >= 500:
		return &UpstreamError{Status: status}
	default:
		return nil
	}
}

// unreachable wraps a transport error without the request's URL.
func unreachable(err error) *UpstreamError {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	return &UpstreamError{Err: err}
}

// Error codes the gateway answers with (the OpenAI "type"/"code").
const (
	codeInvalidRequest = "invalid_request_error"
	codeTooLarge       = "request_too_large"
	codeBudget         = "budget_exceeded"
	codeBusy           = "gateway_busy"
	codeUpstream       = "upstream_error"
	codeNotFound       = "not_found"
)

// anthropicErrorType is the Anthropic error type for a status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	default:
		return "api_error"
	}
}

// errorBody is an error in the shape the API's SDKs parse.
func errorBody(shape errorShape, status int, code, msg string) any {
	if shape == shapeAnthropic {
		return map[string]any{"type": "error", "error": map[string]any{"type": anthropicErrorType(status), "message": msg}}
	}
	return map[string]any{"error": map[string]any{"message": msg, "type": code, "code": code, "param": nil}}
}

// writeError writes an error body in the given shape.
func writeError(w http.ResponseWriter, shape errorShape, status int, code, msg string) {
	writeJSON(w, status, errorBody(shape, status, code, msg))
}

// writeJSON writes v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
