package e2e

import "syscall"

// procAttr makes a child die with the test binary, so a crashed or killed
// test run leaves no fleet processes behind.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
