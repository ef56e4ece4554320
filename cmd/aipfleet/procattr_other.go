//go:build !linux

package main

import "syscall"

// replicaProcAttr: outside Linux a replica stays in dev's process group, so
// a terminal's Ctrl-C reaches it directly (it drains on its own, as it does
// on dev's SIGTERM); should dev be killed, its replicas must be stopped by
// hand (their pids are in the state directory).
func replicaProcAttr() *syscall.SysProcAttr { return nil }
