//go:build !linux && !windows

package main

import "syscall"

// tortureSysProcAttr puts a child in its own process group, so that a Ctrl-C
// at the terminal reaches only the torture, which kills its children.
func tortureSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
