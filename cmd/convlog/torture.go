package main

import (
	"context"
	"errors"
)

func tortureCommand(ctx context.Context, args []string) error {
	return errors.New("torture: not built yet")
}
