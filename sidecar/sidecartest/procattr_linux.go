package sidecartest

import "syscall"

// killWithParent makes a child die with the test binary (StartOptions.KillWithTest).
func killWithParent() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
