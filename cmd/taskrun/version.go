package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
)

func init() {
	register(&command{
		Name:     "version",
		Synopsis: "print the version",
		Flags: func(*pflag.FlagSet) action {
			return func(_ context.Context, a *app, args []string) int {
				if len(args) > 0 {
					return a.usageError("version", fmt.Errorf("unexpected argument %q", args[0]))
				}
				fmt.Fprintln(a.stdout, "taskrun", version)
				return exitOK
			}
		},
	})
}
