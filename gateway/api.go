package gateway

import (
	"encoding/json"
	"net/http"
)

// Names of the model APIs the gateway serves.
const (
	apiChat      = "chat.completions"
	apiResponses = "responses"
	apiMessages  = "messages"
)

// errorShape is how an API's clients expect errors to look.
type errorShape int

const (
	// shapeOpenAI is {"error":{"message","type","code","param"}}.
	shapeOpenAI errorShape = iota
	// shapeAnthropic is {"type":"error","error":{"type","message"}}.
	shapeAnthropic
)

// modelAPI describes one model API: where it is served, the request keys
// the gateway acts on and where its answers report usage.
type modelAPI struct {
	name string
	// path is the agent-facing path; upstreamPath is appended to the upstream's API root.
	path, upstreamPath string
	// knownKeys are the top-level keys checked for duplicates and look-alikes.
	knownKeys []string
	// limitKeys are the completion token limits; the first is added when the agent set none.
	limitKeys []string
	// choicesKey asks for several answers at once (chat's n); it must be absent or 1.
	choicesKey string
	// streamUsageOption is true when usage in a stream must be asked for (chat's stream_options).
	streamUsageOption bool
	shape             errorShape
	// usageKey is the usage object's key in a whole answer.
	usageKey string
	// parseUsage converts the API's usage object.
	parseUsage func(json.RawMessage) (tokenUsage, bool)
	// eventUsage reads the usage one stream event reports into acc.
	eventUsage func(event map[string]json.RawMessage, acc *streamUsage)
}

// The APIs, by name.
var (
	chatAPI = &modelAPI{
		name: apiChat, path: "/v1/chat/completions", upstreamPath: "/chat/completions",
		knownKeys:         []string{keyModel, keyStream, keyStreamOptions, keyMaxTokens, keyMaxCompletionTokens, keyN},
		limitKeys:         []string{keyMaxCompletionTokens, keyMaxTokens},
		choicesKey:        keyN,
		streamUsageOption: true,
		shape:             shapeOpenAI,
		usageKey:          "usage",
		parseUsage:        parseOpenAIUsage,
		eventUsage: func(event map[string]json.RawMessage, acc *streamUsage) {
			if u, ok := parseOpenAIUsage(event["usage"]); ok {
				acc.set(u)
			}
		},
	}
	responsesAPI = &modelAPI{
		name: apiResponses, path: "/v1/responses", upstreamPath: "/responses",
		knownKeys:  []string{keyModel, keyStream, keyMaxOutputTokens, keyBackground, keyPreviousResponseID, keyConversation},
		limitKeys:  []string{keyMaxOutputTokens},
		shape:      shapeOpenAI,
		usageKey:   "usage",
		parseUsage: parseOpenAIUsage,
		eventUsage: func(event map[string]json.RawMessage, acc *streamUsage) {
			switch eventType(event) {
			case "response.completed", "response.incomplete", "response.failed":
				var resp struct {
					Usage json.RawMessage `json:"usage"`
				}
				if json.Unmarshal(event["response"], &resp) == nil {
					if u, ok := parseOpenAIUsage(resp.Usage); ok {
						acc.set(u)
					}
				}
			}
		},
	}
	messagesAPI = &modelAPI{
		name: apiMessages, path: "/v1/messages", upstreamPath: "/messages",
		knownKeys:  []string{keyModel, keyStream, keyMaxTokens},
		limitKeys:  []string{keyMaxTokens},
		shape:      shapeAnthropic,
		usageKey:   "usage",
		parseUsage: parseAnthropicUsage,
		eventUsage: func(event map[string]json.RawMessage, acc *streamUsage) {
			switch eventType(event) {
			case "message_start":
				var msg struct {
					Usage json.RawMessage `json:"usage"`
				}
				if json.Unmarshal(event["message"], &msg) == nil {
					acc.mergeAnthropic(msg.Usage)
				}
			case "message_delta":
				acc.mergeAnthropic(event["usage"])
			}
		},
	}
)

// eventType is the "type" of a stream event's data.
func eventType(event map[string]json.RawMessage) string {
	var t string
	_ = json.Unmarshal(event["type"], &t)
	return t
}

// tokenUsage is what one exchange cost. PromptTokens counts every input
// token, cached or not; the cache counts break it down.
type tokenUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// CacheReadTokens are input tokens read from the provider's prompt cache.
	CacheReadTokens int `json:"cache_read_tokens,omitempty"`
	// CacheWriteTokens are input tokens written to the provider's prompt cache.
	CacheWriteTokens int `json:"cache_write_tokens,omitempty"`
}

// wireUsage is the union of the usage objects of the OpenAI and Anthropic
// APIs; a nil field was absent.
type wireUsage struct {
	PromptTokens        *int `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	InputTokens         *int `json:"input_tokens"`
	OutputTokens        *int `json:"output_tokens"`
	CacheCreationTokens *int `json:"cache_creation_input_tokens"`
	CacheReadTokens     *int `json:"cache_read_input_tokens"`
	PromptDetails       *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// count reads an optional count, treating a negative one as 0.
func count(p *int) int {
	if p == nil || *p < 0 {
		return 0
	}
	return *p
}

// parseOpenAIUsage reads a chat completions (prompt/completion tokens) or
// Responses (input/output tokens) usage object.
func parseOpenAIUsage(raw json.RawMessage) (tokenUsage, bool) {
	var w wireUsage
	if len(raw) == 0 || isNull(raw) || json.Unmarshal(raw, &w) != nil {
		return tokenUsage{}, false
	}
	var u tokenUsage
	switch {
	case w.PromptTokens != nil || w.CompletionTokens != nil:
		u.PromptTokens, u.CompletionTokens = count(w.PromptTokens), count(w.CompletionTokens)
		if w.PromptDetails != nil {
			u.CacheReadTokens = max(w.PromptDetails.CachedTokens, 0)
		}
	case w.InputTokens != nil || w.OutputTokens != nil:
		u.PromptTokens, u.CompletionTokens = count(w.InputTokens), count(w.OutputTokens)
		if w.InputDetails != nil {
			u.CacheReadTokens = max(w.InputDetails.CachedTokens, 0)
		}
	default:
		return tokenUsage{}, false
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u, true
}

// parseAnthropicUsage reads a Messages usage object: input_tokens excludes
// the cache, so the prompt is input plus cache creation plus cache read.
func parseAnthropicUsage(raw json.RawMessage) (tokenUsage, bool) {
	var acc streamUsage
	acc.mergeAnthropic(raw)
	return acc.final()
}

// streamUsage accumulates the usage a stream reports.
type streamUsage struct {
	seen bool
	u    tokenUsage
	// Anthropic's counts, merged event by event.
	input, output, cacheWrite, cacheRead int
	anthropic                            bool
}

// set replaces the usage with a complete report.
func (s *streamUsage) set(u tokenUsage) {
	s.seen, s.u = true, u
}

// mergeAnthropic applies an Anthropic usage object: every count it carries
// is a cumulative total for the message, so it replaces the one before.
func (s *streamUsage) mergeAnthropic(raw json.RawMessage) {
	var w wireUsage
	if len(raw) == 0 || isNull(raw) || json.Unmarshal(raw, &w) != nil {
		return
	}
	for _, f := range []struct {
		src *int
		dst *int
	}{{w.InputTokens, &s.input}, {w.OutputTokens, &s.output}, {w.CacheCreationTokens, &s.cacheWrite}, {w.CacheReadTokens, &s.cacheRead}} {
		if f.src != nil {
			*f.dst = count(f.src)
			s.seen, s.anthropic = true, true
		}
	}
}

// final is the usage reported, if any.
func (s *streamUsage) final() (tokenUsage, bool) {
	if !s.seen {
		return tokenUsage{}, false
	}
	if !s.anthropic {
		return s.u, true
	}
	prompt := s.input + s.cacheWrite + s.cacheRead
	return tokenUsage{
		PromptTokens: prompt, CompletionTokens: s.output, TotalTokens: prompt + s.output,
		CacheReadTokens: s.cacheRead, CacheWriteTokens: s.cacheWrite,
	}, true
}

// shapeOf picks the error shape for a request that is not to a model API:
// Anthropic clients send anthropic-version on every request.
func shapeOf(r *http.Request) errorShape {
	if r.Header.Get("anthropic-version") != "" {
		return shapeAnthropic
	}
	return shapeOpenAI
}
