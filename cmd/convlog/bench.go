package main

import (
	"context"
	"errors"
)

func benchCommand(ctx context.Context, args []string) error {
	return errors.New("bench: not built yet")
}
