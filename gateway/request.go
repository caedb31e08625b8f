package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Keys of a chat completions request that the gateway reads or rewrites.
const (
	keyModel               = "model"
	keyStream              = "stream"
	keyStreamOptions       = "stream_options"
	keyIncludeUsage        = "include_usage"
	keyMaxTokens           = "max_tokens"
	keyMaxCompletionTokens = "max_completion_tokens"
)

// topLevelKeys and optionKeys are the keys checked for look-alikes: the
// gateway reads them by their exact spelling, and a parser that matches keys
// case-insensitively upstream must never see a second spelling.
var (
	topLevelKeys = []string{keyModel, keyStream, keyStreamOptions, keyMaxTokens, keyMaxCompletionTokens}
	optionKeys   = []string{keyIncludeUsage}
)

// chatBody is an agent's chat completions request, parsed from the exact
// keys that are forwarded, so the gateway and the upstream agree on it.
type chatBody struct {
	fields map[string]json.RawMessage
	// stream is true when the agent asked for a streamed answer.
	stream bool
	// includeUsage is true when the agent asked for the usage chunk.
	includeUsage bool
	// completionCap is the smallest completion token limit sent upstream, 0 if none.
	completionCap int
}

// parseChatBody reads the fields the gateway acts on. It refuses duplicate
// keys and keys spelled like a known key in another case, which a different
// JSON parser upstream could read differently.
func parseChatBody(body []byte) (*chatBody, error) {
	fields, err := objectFields(body, topLevelKeys)
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	c := &chatBody{fields: fields}
	if c.stream, err = optionalBool(fields, keyStream); err != nil {
		return nil, err
	}
	if raw, ok := fields[keyStreamOptions]; ok && !isNull(raw) {
		opts, err := objectFields(raw, optionKeys)
		if err != nil {
			return nil, fmt.Errorf("stream_options: %w", err)
		}
		if c.includeUsage, err = optionalBool(opts, keyIncludeUsage); err != nil {
			return nil, fmt.Errorf("stream_options: %w", err)
		}
	}
	for _, key := range []string{keyMaxTokens, keyMaxCompletionTokens} {
		n, ok, err := optionalCount(fields, key)
		if err != nil {
			return nil, err
		}
		if ok {
			c.lowerCap(n)
		}
	}
	return c, nil
}

// upstreamBody rewrites the request for the upstream: the configured model
// replaces whatever the agent named, streamed requests always ask for usage
// so tokens can be metered, and with a token budget (remaining > 0) the
// completion limits are clamped to what is left, max_completion_tokens being
// added when the agent set no limit.
func (c *chatBody) upstreamBody(model string, remaining int) ([]byte, error) {
	c.fields[keyModel], _ = json.Marshal(model)
	if c.stream {
		opts := map[string]json.RawMessage{}
		if raw, ok := c.fields[keyStreamOptions]; ok && !isNull(raw) {
			if err := json.Unmarshal(raw, &opts); err != nil {
				return nil, fmt.Errorf("stream_options must be an object: %w", err)
			}
		}
		opts[keyIncludeUsage] = json.RawMessage("true")
		c.fields[keyStreamOptions], _ = json.Marshal(opts)
	}
	if remaining > 0 {
		c.clamp(remaining)
	}
	out, err := json.Marshal(c.fields)
	if err != nil {
		return nil, fmt.Errorf("encode upstream request: %w", err)
	}
	return out, nil
}

// clamp lowers every completion limit to limit, adding one if none is set.
func (c *chatBody) clamp(limit int) {
	set := false
	for _, key := range []string{keyMaxTokens, keyMaxCompletionTokens} {
		if raw, ok := c.fields[key]; ok && !isNull(raw) {
			set = true
			if n, _, _ := optionalCount(c.fields, key); n > limit {
				c.fields[key], _ = json.Marshal(limit)
			}
		}
	}
	if !set {
		c.fields[keyMaxCompletionTokens], _ = json.Marshal(limit)
	}
	c.lowerCap(limit)
}

// lowerCap notes a completion token limit.
func (c *chatBody) lowerCap(n int) {
	if c.completionCap == 0 || n < c.completionCap {
		c.completionCap = n
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
