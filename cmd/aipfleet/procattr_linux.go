package main

import "syscall"

// replicaProcAttr puts a replica process of aipfleet dev in its own process
// group, so a terminal's Ctrl-C reaches dev alone and dev drains the
// replicas in order, and asks the kernel to send it SIGTERM (a clean drain)
// should dev itself die without stopping it.
func replicaProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
