// Package web holds the pages the edge serves next to its WebSocket: the
// avatar page (/avatar/) and the browser client (/). They are static files
// embedded in the binary; nothing is fetched from elsewhere.
//
// The browser client's script is the TypeScript SDK and the client's own
// code bundled by esbuild into static/client/app.js, which is committed, so
// building the gateway needs no Node. Regenerate it after changing either:
//
//go:generate sh -c "cd ../../sdk/typescript && npm run --silent build:web"
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// AvatarPath is where the avatar page is served.
const AvatarPath = "/avatar/"

// Options chooses what is served.
type Options struct {
	// Client serves the browser client at /.
	Client bool
}

// Handler serves the avatar page and, with opts.Client, the browser client.
// Anything else is 404.
func Handler(opts Options) http.Handler {
	avatar, _ := fs.Sub(static, "static/avatar")
	client, _ := fs.Sub(static, "static/client")
	mux := http.NewServeMux()
	// The avatar page is made to be embedded (a WebView, an iframe).
	mux.Handle("GET "+AvatarPath, page(http.StripPrefix(AvatarPath, http.FileServerFS(avatar)),
		"default-src 'self'; frame-ancestors *"))
	if opts.Client {
		// Images, audio and video the agent sends by url come from its
		// servers: img-src and media-src allow any http(s) origin (they run
		// no script); scripts and styles stay the page's own.
		mux.Handle("GET /", page(http.FileServerFS(client),
			"default-src 'self'; connect-src 'self' ws: wss: blob:; img-src 'self' blob: data: http: https:; media-src 'self' blob: data: http: https:; frame-src 'self' http: https:; frame-ancestors 'none'"))
	}
	return mux
}

// page adds the headers every page gets: its CSP, no sniffing, no caching
// of a page whose files change with the binary.
func page(h http.Handler, csp string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}
