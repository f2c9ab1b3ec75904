//go:build linux

package main

import "syscall"

// tortureSysProcAttr puts a child in its own process group (a Ctrl-C at the
// terminal reaches the torture, which then kills its children itself,
// instead of reaching the service directly and stopping it gracefully) and
// asks the kernel to SIGKILL it should the torture die without cleaning up.
func tortureSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
