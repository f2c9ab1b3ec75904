package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/convlog/convlog/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}
