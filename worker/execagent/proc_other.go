//go:build !unix

package execagent

import "os/exec"

func setProcAttr(*exec.Cmd) {}

func startProcess(cmd *exec.Cmd) error { return cmd.Start() }

func terminate(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}

func killGroup(cmd *exec.Cmd) { terminate(cmd) }
