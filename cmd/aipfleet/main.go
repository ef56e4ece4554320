// Command aipfleet is the operator and developer CLI of the aipfleet
// connector fleet: it runs the control plane, the dispatcher and the
// embedded dev fleet, manages the registry, mints keys and tokens, and
// inspects the fleet. Run `aipfleet --help` for the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err == nil {
		return
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintln(os.Stderr, "aipfleet:", err)
		os.Exit(2)
	}
	if !errors.Is(err, errHelpShown) {
		fmt.Fprintln(os.Stderr, "aipfleet:", err)
		os.Exit(1)
	}
}
