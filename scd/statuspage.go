package scd

import (
	_ "embed"
	"net/http"
)

// statusPage is the live status page served at / on metrics_address: one
// self-contained HTML file (inline CSS and script, nothing fetched from
// elsewhere) that reads /status every 2 s and shows the groups, the
// cluster's nodes and the error answers.
//
//go:embed statuspage.html
var statusPage []byte

// serveStatusPage is GET /. The Content-Security-Policy lets the page load
// nothing but itself and /status, so it stays read-only and offline.
func serveStatusPage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(statusPage)
}
