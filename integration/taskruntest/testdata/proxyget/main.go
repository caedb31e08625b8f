// Command proxyget fetches each URL through $HTTPS_PROXY (or $HTTP_PROXY),
// loopback addresses included, which Go's default client never proxies,
// trusting $SSL_CERT_FILE; it prints the status and body.
package main

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
)

func main() {
	proxy, err := url.Parse(cmp.Or(os.Getenv("HTTPS_PROXY"), os.Getenv("HTTP_PROXY")))
	if err != nil {
		fmt.Println("proxy:", err)
		os.Exit(2)
	}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	code := 0
	for _, u := range os.Args[1:] {
		resp, err := c.Get(u)
		if err != nil {
			fmt.Printf("GET %s: error: %v\n", u, err)
			code = 1
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		fmt.Printf("GET %s: %d\n%s\n", u, resp.StatusCode, body)
	}
	os.Exit(code)
}
