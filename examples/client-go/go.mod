module example.com/client-go

go 1.26.8

require tpsched v0.0.0

// The example builds against this checkout of tpsched; a project of your
// own points the replace at where tpsched lives.
replace tpsched => ../..
