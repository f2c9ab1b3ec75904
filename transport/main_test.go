package transport_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes its servers, streams and logs; a goroutine left behind
// is a handler that did not notice its client leave, or a leaked waiter.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
