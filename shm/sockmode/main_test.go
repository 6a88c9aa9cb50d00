package sockmode

import (
	"os"
	"testing"

	"tpsched/internal/leakcheck"
)

// Every goroutine the package starts ends at its Close.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
