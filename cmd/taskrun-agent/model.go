package main

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// runModel runs the tool-using loop against the model gateway.
func runModel(ctx context.Context, c agentConfig, out io.Writer, tr *tracer) error {
	return fmt.Errorf("model socket %s: %w", c.ModelSocket, errors.ErrUnsupported)
}
