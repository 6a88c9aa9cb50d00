package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ServeHTTPWorker runs the Go HTTP worker that HAProxy balances over:
// POST /echo answers the body, POST /burn burns the microseconds the body
// names and answers it. One worker is one process; the harness runs it with
// GOMAXPROCS=1 so a pool of N workers is N processes, as a PHP-FPM pool or a
// tpsched resident pool is.
func ServeHTTPWorker(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, b []byte) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		reply(w, b)
	})
	mux.HandleFunc("POST /burn", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		burn(parseMicros(b))
		reply(w, b)
	})
	srv := &http.Server{Handler: mux, IdleTimeout: 10 * time.Minute}
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
