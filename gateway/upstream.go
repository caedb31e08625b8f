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

// upstream is where the gateway forwards chat completions.
type upstream struct {
	client *http.Client
	// chatURL is the upstream's chat completions endpoint.
	chatURL string
	// key is the API key, injected host-side; empty for the scripted provider.
	key string
	// model is the model name sent upstream, whatever the agent asked for.
	model string
	// publicName is the model name shown to the agent.
	publicName string
}

// scriptedModelName is what the agent sees as the model of a scripted run.
const scriptedModelName = "scripted"

// newUpstream builds the upstream for cfg.Model.
func newUpstream(cfg Config) (*upstream, error) {
	m := cfg.Model
	switch m.Provider {
	case config.ProviderOpenAI:
		return newOpenAIUpstream(cfg)
	case config.ProviderScripted:
		script, err := loadScript(m.Name)
		if err != nil {
			return nil, err
		}
		return &upstream{
			client:     &http.Client{Transport: script},
			chatURL:    "http://scripted.invalid/v1/chat/completions",
			model:      scriptedModelName,
			publicName: scriptedModelName,
		}, nil
	default:
		return nil, fmt.Errorf("%w: provider %q is unknown: use %q or %q", ErrBadConfig, m.Provider, config.ProviderOpenAI, config.ProviderScripted)
	}
}

// newOpenAIUpstream checks the model entry and reads its key on the host.
func newOpenAIUpstream(cfg Config) (*upstream, error) {
	m := cfg.Model
	if m.Name == "" {
		return nil, fmt.Errorf("%w: model name is empty: set name, e.g. gpt-4o-mini", ErrBadConfig)
	}
	base, err := url.Parse(m.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("%w: base_url %q must be an http(s) URL such as https://api.openai.com/v1", ErrBadConfig, m.BaseURL)
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
		chatURL:    strings.TrimSuffix(base.String(), "/") + "/chat/completions",
		key:        key,
		model:      m.Name,
		publicName: m.Name,
	}, nil
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

// send posts a chat completions body upstream with the key injected.
func (u *upstream) send(ctx context.Context, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.chatURL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if u.key != "" {
		req.Header.Set("Authorization", "Bearer "+u.key)
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("upstream request: %w", err)
	}
	return resp, nil
}
