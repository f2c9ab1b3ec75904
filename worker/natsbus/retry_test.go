package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/convlog/convlog/worker/natsbus"
)

func TestRetryStart(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	down := errors.New("broker down")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name       string
		ctx        context.Context
		results    []error // of the successive starts; the last repeats
		wantErr    error
		wantStarts int
		wantFailed int
	}{
		{"at once", context.Background(), []error{nil}, nil, 1, 0},
		{"after two failures", context.Background(), []error{down, down, nil}, nil, 3, 2},
		{"namespace in use stops it", context.Background(), []error{down, fmt.Errorf("claim: %w", natsbus.ErrNamespaceInUse)}, natsbus.ErrNamespaceInUse, 2, 1},
		{"a stop ends the wait", cancelled, []error{down}, nil, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			starts, failed := 0, 0
			err := natsbus.RetryStart(tt.ctx, quiet, "test", func() error {
				r := tt.results[min(starts, len(tt.results)-1)]
				starts++
				return r
			}, func(error) { failed++ })
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if starts != tt.wantStarts || failed != tt.wantFailed {
				t.Fatalf("%d starts, %d failures reported; want %d, %d", starts, failed, tt.wantStarts, tt.wantFailed)
			}
		})
	}
}
