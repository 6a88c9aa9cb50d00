module example.com/uap-go

go 1.26.8

require tpsched v0.0.0

require golang.org/x/sys v0.50.0 // indirect

// tpsched's module path is no address the Go proxy serves, so the replace
// points at a checkout of tpsched: here the repository this example is in
// (make install points it at the checkout it ran in). A module of your own
// does the same: go mod edit -replace tpsched=/path/to/tpsched
replace tpsched => ../..
