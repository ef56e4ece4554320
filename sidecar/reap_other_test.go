//go:build !linux

package sidecar

import (
	"fmt"
	"os"
)

// runSubreaperHelper: the subreaper helper is Linux's (reap_linux_test.go).
func runSubreaperHelper(string) int {
	fmt.Fprintln(os.Stderr, "subreaper helper: Linux only")
	return 3
}
