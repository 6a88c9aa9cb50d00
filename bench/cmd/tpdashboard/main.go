// Command tpdashboard draws the panels of tpsched's Grafana dashboard
// (dist/grafana/tpsched.json) from a real run, for the README: Grafana
// itself cannot be installed here (it is not in Debian, and its Go module
// is not a build of the server). It is not Grafana: it evaluates each
// panel's PromQL, as the dashboard writes it, with a real Prometheus that
// scraped real nodes, and draws the series with gonum/plot on the
// dashboard's grid.
//
//	tpdashboard -load 120s -rpc 127.0.0.2:PORT,127.0.0.3:PORT,127.0.0.4:PORT \
//	    -prometheus http://127.0.0.1:19090 -out docs/img/dashboard.png
//
// With -load it first drives calls into the cluster for that long (the
// phases are printed as they start), then waits for the last scrapes and
// draws the time since the load began. With -page it also takes a node's
// status page in headless Chromium, in the middle of the run. tools/screenshots.sh starts the nodes and
// Prometheus and runs it (make screenshots).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"
	"tpsched/internal/version"
)

func main() {
	dash := flag.String("dashboard", "dist/grafana/tpsched.json", "the Grafana dashboard whose panels to draw")
	prom := flag.String("prometheus", "http://127.0.0.1:19090", "the Prometheus that scraped the nodes")
	out := flag.String("out", "docs/img/dashboard.png", "the PNG to write")
	rpc := flag.String("rpc", "", "RPC addresses of the nodes, comma-separated (needed with -load)")
	load := flag.Duration("load", 0, "drive calls into the nodes for this long first (0: draw -since until now)")
	since := flag.Duration("since", 2*time.Minute, "without -load: draw this much time back from now")
	rate := flag.String("rate-interval", "5s", "what $__rate_interval becomes (Grafana: four scrape intervals at least)")
	width := flag.Int("width", 1800, "width of the PNG in pixels")
	page := flag.String("page", "", "also take this page (a node's status page) in headless Chromium")
	pageOut := flag.String("page-out", "docs/img/status-page.png", "the PNG of -page")
	pageAt := flag.Float64("page-at", 0.5, "with -load: open -page at this share of the run")
	pageWait := flag.Duration("page-wait", 6*time.Second, "how long -page runs (in real time) before it is taken")
	showVersion := flag.Bool("version", false, "print tpdashboard's version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Line("tpdashboard"))
		return
	}
	log.SetFlags(0)
	log.SetPrefix("tpdashboard: ")

	if *page != "" && *load == 0 {
		if err := shootPage(context.Background(), *page, *pageOut, *pageWait, 1400, 720); err != nil {
			log.Fatalf("%s: %v", *page, err)
		}
		fmt.Printf("tpdashboard: %s written to %s\n", *page, *pageOut)
	}
	d, err := readDashboard(*dash)
	if err != nil {
		log.Fatal(err)
	}
	end := time.Now()
	start := end.Add(-*since)
	if *load > 0 {
		if *rpc == "" {
			log.Fatal("-load needs -rpc")
		}
		ctx, cancel := context.WithTimeout(context.Background(), *load+time.Minute)
		defer cancel()
		start = time.Now().Add(-5 * time.Second)
		shot := make(chan error, 1)
		go func() {
			if *page == "" {
				shot <- nil
				return
			}
			time.Sleep(time.Duration(*pageAt * float64(*load)))
			shot <- shootPage(ctx, *page, *pageOut, *pageWait, 1400, 720)
		}()
		if err := drive(ctx, strings.Split(*rpc, ","), *load); err != nil {
			log.Fatal(err)
		}
		if err := <-shot; err != nil {
			log.Fatalf("%s: %v", *page, err)
		}
		time.Sleep(3 * time.Second) // the last scrapes
		end = time.Now()
	}
	q := &promClient{base: strings.TrimSuffix(*prom, "/"), vars: map[string]string{
		"$__rate_interval": *rate, "$instance": ".*", "$group": ".*", "$job": ".*",
	}}
	data, err := q.evaluate(d, start, end)
	if err != nil {
		log.Fatal(err)
	}
	png, err := render(d, data, start, end, *width)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, png, 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("tpdashboard: %d panels, %v of data, written to %s\n", len(d.panels()), end.Sub(start).Round(time.Second), *out)
}
