//go:build unix && !linux

package execagent

import (
	"os/exec"
	"syscall"
)

// Without a parent-death signal, the group is killed when the turn ends;
// a kill -9 of convlog can leave the program running until it exits.
func setDeathSignal(*syscall.SysProcAttr) {}

func startLocked(cmd *exec.Cmd) error { return cmd.Start() }
