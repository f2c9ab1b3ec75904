//go:build windows

package main

import "syscall"

func tortureSysProcAttr() *syscall.SysProcAttr { return nil }
