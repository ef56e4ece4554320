//go:build !linux

package sidecartest

import "syscall"

// killWithParent: without Pdeathsig, children are stopped by the tests'
// cleanups only (StartOptions.KillWithTest).
func killWithParent() *syscall.SysProcAttr { return nil }
