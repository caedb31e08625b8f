// Package config holds the settings that choose a model and configure the executor.
package config

// Model providers understood by the gateway.
const (
	// ProviderScripted replays a JSONL script of responses: no network, no key.
	ProviderScripted = "scripted"
	// ProviderOpenAI speaks the OpenAI chat completions and Responses APIs to BaseURL.
	ProviderOpenAI = "openai"
	// ProviderAnthropic speaks the Anthropic Messages API to BaseURL
	// (default https://api.anthropic.com/v1).
	ProviderAnthropic = "anthropic"
)

// ModelEntry says which model a run uses, where it is served and how to authenticate.
// The API key itself is never stored here: only where the host reads it from.
type ModelEntry struct {
	// Provider is one of the Provider constants.
	Provider string `json:"provider"`
	// Name is the model name sent upstream (for scripted: the script's path).
	Name string `json:"name"`
	// BaseURL is the upstream API root, e.g. https://api.openai.com/v1 or
	// https://api.anthropic.com/v1.
	BaseURL string `json:"base_url,omitempty"`
	// APIKeyEnv names a host environment variable holding the API key.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// APIKeyFile names a host file holding the API key.
	APIKeyFile string `json:"api_key_file,omitempty"`
	// MaxTokens caps prompt plus completion tokens for one run; 0 means no cap.
	MaxTokens int `json:"max_tokens,omitempty"`
	// MaxRequests caps model requests for one run; 0 means no cap.
	MaxRequests int `json:"max_requests,omitempty"`
}

// IsZero reports whether no model is configured.
func (m ModelEntry) IsZero() bool { return m.Provider == "" }
