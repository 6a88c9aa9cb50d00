module example.com/uap-go

go 1.26.8

require tpsched v0.0.0

require golang.org/x/sys v0.50.0 // indirect

// The example builds against this checkout of tpsched; a project of your
// own points the replace at where tpsched lives.
replace tpsched => ../..
