//go:build !linux

package e2e

import "syscall"

// procAttr: children are cleaned up by the tests' cleanups only.
func procAttr() *syscall.SysProcAttr { return nil }
