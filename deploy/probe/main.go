// Command hermes-probe is the health check of the container image, which has
// no shell and no curl: it GETs a URL and exits 0 when the answer is 2xx,
// 1 otherwise (printing why). Compose runs it as a service's healthcheck:
//
//	hermes-probe http://127.0.0.1:8789/readyz
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// timeout bounds the whole check, so a hung service fails it.
const timeout = 3 * time.Second

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: hermes-probe URL")
		os.Exit(2)
	}
	if err := probe(os.Args[1], timeout); err != nil {
		fmt.Fprintln(os.Stderr, "hermes-probe:", err)
		os.Exit(1)
	}
}

// probe GETs url and returns nil for a 2xx answer within timeout.
func probe(url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s %s", url, res.Status, body)
	}
	return nil
}
