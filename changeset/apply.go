package changeset

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// Apply applies patch (as Compute writes it) to the working tree dir with
// the host's `git apply`, run with the same hardened environment as the rest
// of this package. Nothing is changed unless every hunk applies.
func Apply(ctx context.Context, dir string, patch io.Reader) error {
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("changeset: apply: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("changeset: apply: %s is not a directory: give the checkout to apply the patch to", dir)
	}
	br := bufio.NewReader(patch)
	if _, err := br.Peek(1); errors.Is(err, io.EOF) {
		return nil // an empty change set: nothing to apply
	}
	if _, _, err := runGit(ctx, dir, br, "apply", "--whitespace=nowarn", "-"); err != nil {
		return fmt.Errorf("changeset: apply: %w", err)
	}
	return nil
}
