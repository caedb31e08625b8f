package gateway

import (
	"fmt"
	"os"
	"strings"

	"github.com/taskrun/taskrun/config"
)

// readAPIKey reads the model's API key on the host from the environment
// variable or file the ModelEntry names.
func readAPIKey(m config.ModelEntry) (string, error) {
	switch {
	case m.APIKeyEnv != "":
		key := strings.TrimSpace(os.Getenv(m.APIKeyEnv))
		if key == "" {
			return "", fmt.Errorf("%w: environment variable %s (api_key_env) is empty: export the key on the executor host", ErrBadConfig, m.APIKeyEnv)
		}
		return key, nil
	case m.APIKeyFile != "":
		data, err := os.ReadFile(m.APIKeyFile)
		if err != nil {
			return "", fmt.Errorf("%w: read api_key_file: %w", ErrBadConfig, err)
		}
		key := strings.TrimSpace(string(data))
		if key == "" {
			return "", fmt.Errorf("%w: api_key_file %s is empty: write the key into it", ErrBadConfig, m.APIKeyFile)
		}
		return key, nil
	default:
		return "", fmt.Errorf("%w: model %q has no key source: set api_key_env or api_key_file", ErrBadConfig, m.Name)
	}
}
