// Command httpget fetches each URL with Go's default HTTP client (which
// honors HTTPS_PROXY and SSL_CERT_FILE) and prints the status and body, for
// the egress container tests.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	failed := false
	for _, u := range os.Args[1:] {
		resp, err := http.Get(u)
		if err != nil {
			fmt.Printf("GET %s: error: %v\n", u, err)
			failed = true
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		fmt.Printf("GET %s: %d\n%s\n", u, resp.StatusCode, body)
	}
	if failed {
		os.Exit(1)
	}
}
