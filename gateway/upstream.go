package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/taskrun/taskrun/config"
)

// AnthropicVersion is the anthropic-version header the gateway sends to the
// Anthropic API, whatever the agent sent.
const AnthropicVersion = "2023-06-01"

// DefaultAnthropicBaseURL is the Anthropic API root used when a model entry
// names none.
const DefaultAnthropicBaseURL = "https://api.anthropic.com/v1"

// upstream is where the gateway forwards model requests.
type upstream struct {
	client *http.Client
	// baseURL is the upstream's API root, e.g. https://api.openai.com/v1.
	baseURL string
	// apis are the APIs the upstream speaks.
	apis []*modelAPI
	// key is the API key, injected host-side; empty for the scripted provider.
	key string
	// auth sets the key and the provider's fixed headers on a request.
	auth func(h http.Header, agent http.Header)
	// model is the model name sent upstream, whatever the agent asked for.
	model string
	// publicName is the model name shown to the agent.
	publicName string
}

// scriptedModelName is what the agent sees as the model of a scripted run.
const scriptedModelName = "scripted"

// ModelName is the model's name as the agent sees it (TASKRUN_MODEL, the
// models listing): the configured name, or scriptedModelName for a scripted
// model, whose configured name is its script.
func ModelName(m config.ModelEntry) string {
	if m.Provider == config.ProviderScripted {
		return scriptedModelName
	}
	return m.Name
}

// newUpstream builds the upstream for cfg.Model.
func newUpstream(cfg Config) (*upstream, error) {
	m := cfg.Model
	switch m.Provider {
	case config.ProviderOpenAI:
		return newKeyedUpstream(cfg, m.BaseURL, []*modelAPI{chatAPI, responsesAPI}, func(key string) func(h, _ http.Header) {
			return func(h, _ http.Header) { h.Set("Authorization", "Bearer "+key) }
		})
	case config.ProviderAnthropic:
		base := m.BaseURL
		if base == "" {
			base = DefaultAnthropicBaseURL
		}
		return newKeyedUpstream(cfg, base, []*modelAPI{messagesAPI}, func(key string) func(h, agent http.Header) {
			return func(h, agent http.Header) {
				h.Set("x-api-key", key)
				h.Set("anthropic-version", AnthropicVersion)
				// Beta features change what the API accepts, not who pays: pass them on.
				for _, v := range agent.Values("anthropic-beta") {
					h.Add("anthropic-beta", v)
				}
			}
		})
	case config.ProviderScripted:
		script, err := loadScript(m.Name)
		if err != nil {
			return nil, err
		}
		return &upstream{
			client:     &http.Client{Transport: script},
			baseURL:    "http://scripted.invalid/v1",
			apis:       []*modelAPI{chatAPI, responsesAPI, messagesAPI},
			auth:       func(_, _ http.Header) {},
			model:      scriptedModelName,
			publicName: ModelName(m),
		}, nil
	default:
		return nil, fmt.Errorf("%w: provider %q is unknown: use %q, %q or %q", ErrBadConfig, m.Provider, config.ProviderOpenAI, config.ProviderAnthropic, config.ProviderScripted)
	}
}

// newKeyedUpstream checks a model entry with a key and reads the key on the host.
func newKeyedUpstream(cfg Config, baseURL string, apis []*modelAPI, auth func(key string) func(h, agent http.Header)) (*upstream, error) {
	m := cfg.Model
	if m.Name == "" {
		return nil, fmt.Errorf("%w: model name is empty: set name, e.g. gpt-4o-mini or claude-sonnet-4-5", ErrBadConfig)
	}
	base, err := url.Parse(baseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("%w: base_url %q must be an http(s) URL such as https://api.openai.com/v1", ErrBadConfig, baseURL)
	}
	key, err := readAPIKey(m)
	if err != nil {
		return nil, err
	}
	client := cfg.HTTPClient
	if client == nil {
		client = defaultHTTPClient()
	}
	return &upstream{
		client:     client,
		baseURL:    strings.TrimSuffix(base.String(), "/"),
		apis:       apis,
		key:        key,
		auth:       auth(key),
		model:      m.Name,
		publicName: ModelName(m),
	}, nil
}

// speaks reports whether the upstream serves api.
func (u *upstream) speaks(api *modelAPI) bool {
	for _, a := range u.apis {
		if a == api {
			return true
		}
	}
	return false
}

// defaultHTTPClient bounds connection set-up but not streamed bodies, which
// the per-exchange context bounds instead.
func defaultHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		MaxIdleConns:          4,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}}
}

// send posts a request body to api upstream with the key injected. Only
// the headers the gateway sets are sent: none of the agent's credentials.
func (u *upstream) send(ctx context.Context, api *modelAPI, body []byte, agent http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.baseURL+api.upstreamPath, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	u.auth(req.Header, agent)
	return u.client.Do(req)
}
