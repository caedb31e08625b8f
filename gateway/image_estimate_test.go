package gateway

import (
	"encoding/base64"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dataURL is a 150 KB PNG data URL: 50,000 tokens if counted as text.
func dataURL() string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("\x89PNG pixels ", 10_000)))
}

// An image is estimated at ImageTokens whatever its encoded size, in each
// API's shape; the text around it is still counted by its bytes.
func TestImagesAreEstimatedAtAFixedCost(t *testing.T) {
	img := dataURL()
	text := strings.Repeat("word ", 300)
	for name, body := range map[string]string{
		"chat":      `{"messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"},{"type":"image_url","image_url":{"url":"` + img + `"}}]}]}`,
		"responses": `{"input":[{"role":"user","content":[{"type":"input_text","text":"` + text + `"},{"type":"input_image","image_url":"` + img + `"}]}]}`,
		"messages":  `{"messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + img[len("data:image/png;base64,"):] + `"}}]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			got := estimateTokens([]byte(body), 5)
			assert.GreaterOrEqual(t, got, ImageTokens+len(text)/BytesPerToken, "the text and the image are both counted")
			assert.Less(t, got, ImageTokens+len(text)/BytesPerToken+100, "the image's bytes are not counted as text")
		})
	}
	two := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}},{"type":"image_url","image_url":{"url":"` + img + `"}}]}]}`
	assert.GreaterOrEqual(t, estimateTokens([]byte(two), 5), 2*ImageTokens, "each image counts, a URL one too")
}

// A request with one large image fits a budget its base64 length alone
// would have refused.
func TestARequestWithAnImageFitsTheBudget(t *testing.T) {
	var requests atomic.Int32
	up := worstCaseUpstream(t, &requests)
	m := openAIModel(t, up.URL)
	m.MaxTokens = 10_000
	g, c, _ := startConfig(t, Config{Model: m})
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"` + dataURL() + `"}}]}],"max_tokens":100}`
	resp, out := rawChat(t, c, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	assert.Equal(t, int32(1), requests.Load())
	require.NoError(t, g.Close())
}
