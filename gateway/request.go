package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Keys of a model request that the gateway reads or rewrites.
const (
	keyModel               = "model"
	keyStream              = "stream"
	keyStreamOptions       = "stream_options"
	keyIncludeUsage        = "include_usage"
	keyMaxTokens           = "max_tokens"
	keyMaxCompletionTokens = "max_completion_tokens"
	keyMaxOutputTokens     = "max_output_tokens"
	keyN                   = "n"
	keyBackground          = "background"
	keyPreviousResponseID  = "previous_response_id"
	keyConversation        = "conversation"
)

// optionKeys are the stream_options keys checked for look-alikes.
var optionKeys = []string{keyIncludeUsage}

// modelRequest is an agent's request to one of the model APIs, parsed from
// the exact keys that are forwarded, so the gateway and the upstream agree
// on it.
type modelRequest struct {
	api    *modelAPI
	fields map[string]json.RawMessage
	// stream is true when the agent asked for a streamed answer.
	stream bool
	// includeUsage is true when the agent asked for the usage chunk (chat completions).
	includeUsage bool
	// completionCap is the smallest completion token limit sent upstream, 0 if none.
	completionCap int
	// serverState is true when the request continues state held by the
	// upstream (a previous response or conversation), so its prompt cannot
	// be estimated from its body.
	serverState bool
}

// parseRequest reads the fields the gateway acts on. It refuses duplicate
// keys and keys spelled like a known key in another case, which a different
// JSON parser upstream could read differently, and requests the gateway
// cannot meter.
func parseRequest(api *modelAPI, body []byte) (*modelRequest, error) {
	fields, err := objectFields(body, api.knownKeys)
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	r := &modelRequest{api: api, fields: fields}
	if r.stream, err = optionalBool(fields, keyStream); err != nil {
		return nil, err
	}
	if api.streamUsageOption {
		if raw, ok := fields[keyStreamOptions]; ok && !isNull(raw) {
			opts, err := objectFields(raw, optionKeys)
			if err != nil {
				return nil, fmt.Errorf("stream_options: %w", err)
			}
			if r.includeUsage, err = optionalBool(opts, keyIncludeUsage); err != nil {
				return nil, fmt.Errorf("stream_options: %w", err)
			}
		}
	}
	for _, key := range api.limitKeys {
		n, ok, err := optionalCount(fields, key)
		if err != nil {
			return nil, err
		}
		if ok {
			r.lowerCap(n)
		}
	}
	if key := api.choicesKey; key != "" {
		if n, ok, err := optionalCount(fields, key); err != nil {
			return nil, err
		} else if ok && n != 1 {
			return nil, fmt.Errorf("%s=%d: the gateway serves one choice per request; omit %s or set it to 1", key, n, key)
		}
	}
	if api.name == apiResponses {
		if bg, err := optionalBool(fields, keyBackground); err != nil {
			return nil, err
		} else if bg {
			return nil, errors.New("background=true: the gateway cannot meter a response it does not relay; send the request without background")
		}
		for _, key := range []string{keyPreviousResponseID, keyConversation} {
			if raw, ok := fields[key]; ok && !isNull(raw) {
				r.serverState = true
			}
		}
	}
	return r, nil
}

// upstreamBody rewrites the request for the upstream: the configured model
// replaces whatever the agent named, streamed chat completions always ask
// for usage so tokens can be metered, and with a completion limit
// (limit > 0) every completion limit is clamped to it, the API's own limit
// key being added when the agent set none.
func (r *modelRequest) upstreamBody(model string, limit int) ([]byte, error) {
	r.fields[keyModel], _ = json.Marshal(model)
	if r.stream && r.api.streamUsageOption {
		opts := map[string]json.RawMessage{}
		if raw, ok := r.fields[keyStreamOptions]; ok && !isNull(raw) {
			if err := json.Unmarshal(raw, &opts); err != nil {
				return nil, fmt.Errorf("stream_options must be an object: %w", err)
			}
		}
		opts[keyIncludeUsage] = json.RawMessage("true")
		r.fields[keyStreamOptions], _ = json.Marshal(opts)
	}
	if limit > 0 {
		r.clamp(limit)
	}
	out, err := json.Marshal(r.fields)
	if err != nil {
		return nil, fmt.Errorf("encode upstream request: %w", err)
	}
	return out, nil
}

// clamp lowers every completion limit to limit, adding the API's default
// limit key if none is set.
func (r *modelRequest) clamp(limit int) {
	set := false
	for _, key := range r.api.limitKeys {
		if raw, ok := r.fields[key]; ok && !isNull(raw) {
			set = true
			if n, _, _ := optionalCount(r.fields, key); n > limit {
				r.fields[key], _ = json.Marshal(limit)
			}
		}
	}
	if !set {
		r.fields[r.api.limitKeys[0]], _ = json.Marshal(limit)
	}
	r.lowerCap(limit)
}

// lowerCap notes a completion token limit.
func (r *modelRequest) lowerCap(n int) {
	if r.completionCap == 0 || n < r.completionCap {
		r.completionCap = n
	}
}

// objectFields decodes a JSON object, refusing duplicate keys and keys that
// match one of known case-insensitively but not exactly.
func objectFields(raw []byte, known []string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("must be a JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("invalid JSON: %w", err)
		}
		key, _ := tok.(string)
		if err := checkKey(fields, key, known); err != nil {
			return nil, err
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, fmt.Errorf("invalid JSON value for %q: %w", key, err)
		}
		fields[key] = value
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("trailing data after the JSON object: send one object")
	}
	return fields, nil
}

// checkKey refuses a repeated key or a look-alike of a known key.
func checkKey(seen map[string]json.RawMessage, key string, known []string) error {
	if _, dup := seen[key]; dup {
		return fmt.Errorf("key %q appears twice: send each key once", key)
	}
	for _, k := range known {
		if key != k && strings.EqualFold(key, k) {
			return fmt.Errorf("key %q must be spelled %q", key, k)
		}
	}
	return nil
}

// optionalBool reads a boolean field; absent or null is false.
func optionalBool(fields map[string]json.RawMessage, key string) (bool, error) {
	raw, ok := fields[key]
	if !ok || isNull(raw) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		return false, fmt.Errorf("%s must be true or false, not %s", key, raw)
	}
	return b, nil
}

// optionalCount reads a non-negative integer field; ok is false when absent or null.
func optionalCount(fields map[string]json.RawMessage, key string) (n int, ok bool, err error) {
	raw, present := fields[key]
	if !present || isNull(raw) {
		return 0, false, nil
	}
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
		return 0, false, fmt.Errorf("%s must be a non-negative integer, not %s", key, raw)
	}
	return n, true, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }
