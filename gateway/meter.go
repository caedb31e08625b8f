package gateway

import (
	"encoding/json"
	"fmt"
	"sync"
)

// BytesPerToken is how the gateway estimates a prompt's tokens before the
// upstream counts them: one token per this many bytes of request body.
// Text averages about four bytes per token and JSON framing adds more, so
// the estimate errs high.
const BytesPerToken = 3

// rewriteOverhead bounds the bytes the gateway adds to a request besides
// the model's name (the limit key and its value, stream options).
const rewriteOverhead = 64

// ImageTokens is what the gateway estimates one image of a prompt at,
// whatever its encoded size: the APIs bill an image by its pixels, after
// scaling it down, at about a thousand to a few thousand tokens, never by
// the length of its base64 or its URL. It errs high.
const ImageTokens = 3000

// estimateTokens is the estimated prompt tokens of a request body sent
// upstream for a model named modelBytes long: one token per BytesPerToken
// bytes of its text and framing, and ImageTokens per image part (whose
// bytes, a data URL or base64 data, are not counted as text).
func estimateTokens(body []byte, modelBytes int) int {
	images, imageBytes := imageParts(body)
	text := len(body) - imageBytes
	return (text+modelBytes+rewriteOverhead+BytesPerToken-1)/BytesPerToken + images*ImageTokens
}

// imageTypes are the "type" values of an image part in the chat
// completions ("image_url"), responses ("input_image") and messages
// ("image") APIs.
var imageTypes = map[string]bool{"image_url": true, "input_image": true, "image": true}

// imageParts counts the image parts of a JSON request body and the bytes
// of the strings inside them (the image's URL or data). A body that is not
// JSON has none.
func imageParts(body []byte) (count, stringBytes int) {
	var doc any
	if json.Unmarshal(body, &doc) != nil {
		return 0, 0
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if t, _ := v["type"].(string); imageTypes[t] {
				count++
				stringBytes += stringLen(v)
				return
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	return count, min(stringBytes, len(body))
}

// stringLen is the total length of the strings in v, as JSON encodes them
// at the least.
func stringLen(v any) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case map[string]any:
		n := 0
		for _, e := range v {
			n += stringLen(e)
		}
		return n
	case []any:
		n := 0
		for _, e := range v {
			n += stringLen(e)
		}
		return n
	}
	return 0
}

// meter counts what the run spends and enforces its budgets. Before a
// request is forwarded it reserves the most the request can cost (its
// estimated prompt plus its completion limit, clamped to what is left), so
// the token budget is only overshot when the upstream counts more prompt
// tokens than the estimate.
type meter struct {
	mu          sync.Mutex
	maxTokens   int
	maxRequests int
	used        Usage
	// reserved is what the exchange in flight may still cost.
	reserved int
	exceeded error
}

func newMeter(maxTokens, maxRequests int) *meter {
	return &meter{maxTokens: maxTokens, maxRequests: maxRequests}
}

// admit reserves one request whose prompt is estimated at promptTokens and
// returns the completion limit to send upstream (0 without a token
// budget), or refuses it with an ErrBudgetExceeded error (which Err then
// reports) when a budget is spent or the prompt alone would overspend it.
func (m *meter) admit(promptTokens int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxRequests > 0 && m.used.Requests >= m.maxRequests {
		return 0, m.exceed(fmt.Errorf("%w: max_requests=%d spent", ErrBudgetExceeded, m.maxRequests))
	}
	limit := 0
	if m.maxTokens > 0 {
		left := m.maxTokens - m.used.TotalTokens() - m.reserved
		if left <= 0 {
			return 0, m.exceed(fmt.Errorf("%w: max_tokens=%d spent (%d used)", ErrBudgetExceeded, m.maxTokens, m.used.TotalTokens()))
		}
		if promptTokens >= left {
			return 0, m.exceed(fmt.Errorf("%w: max_tokens=%d: the request's prompt is estimated at %d tokens (one per %d bytes of text, %d per image) and only %d are left", ErrBudgetExceeded, m.maxTokens, promptTokens, BytesPerToken, ImageTokens, left))
		}
		limit = left - promptTokens
		m.reserved += promptTokens + limit
	}
	m.used.Requests++
	return limit, nil
}

// settle ends an admitted exchange: it releases its reservation and
// records what the upstream reported, if anything; going past the token
// budget marks the run as over budget.
func (m *meter) settle(reserved int, u *tokenUsage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved = max(m.reserved-reserved, 0)
	if u == nil {
		return
	}
	m.used.PromptTokens += u.PromptTokens
	m.used.CompletionTokens += u.CompletionTokens
	m.used.CacheReadTokens += u.CacheReadTokens
	m.used.CacheWriteTokens += u.CacheWriteTokens
	if m.maxTokens > 0 && m.used.TotalTokens() > m.maxTokens {
		m.exceed(fmt.Errorf("%w: max_tokens=%d exceeded (%d used)", ErrBudgetExceeded, m.maxTokens, m.used.TotalTokens()))
	}
}

// exceed keeps the first budget error and returns err.
func (m *meter) exceed(err error) error {
	if m.exceeded == nil {
		m.exceeded = err
	}
	return err
}

// hasTokenBudget reports whether the run has a token budget.
func (m *meter) hasTokenBudget() bool { return m.maxTokens > 0 }

func (m *meter) usage() Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

func (m *meter) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exceeded
}
