//go:build linux

package execagent

import (
	"os/exec"
	"runtime"
	"syscall"
)

// setDeathSignal makes the kernel kill the program when convlog dies,
// however it dies.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// startLocked starts cmd from a thread locked for the call. The parent-
// death signal is sent when the thread that forked the child exits, not
// the process; Go threads outlive goroutines unless locked ones exit, and
// this one is unlocked again, so it stays in the runtime's pool.
func startLocked(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return cmd.Start()
}
