// Command convlog is the convlog service: durable, offset-addressed
// conversation logs, with workers that run agents and readers that tail
// conversations over SSE or JSON polling.
//
//	convlog serve [flags]   run the service (embedded NATS and bbolt by default)
//	convlog worker [flags]  run agents for a `serve` elsewhere, over NATS
//	convlog --version       print the version and commit
//	convlog backup, restore copy the log out of a running service, and back
//	convlog send, tail, ls  client verbs against a running service
//
// The benchmark (cmd/convlog-bench) and the torture harness
// (cmd/convlog-torture) are programs of their own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is set at build time (-ldflags "-X main.version=v1.2.3"); the
// commit comes from the build info Go records.
var version = "dev"

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serveCommand(ctx, os.Args[2:])
	case "worker":
		err = workerCommand(ctx, os.Args[2:])
	case "version", "-version", "--version":
		fmt.Println(versionString())
		return
	case "backup":
		err = backupCommand(ctx, os.Args[2:])
	case "restore":
		err = restoreCommand(ctx, os.Args[2:])
	case "send", "tail", "ls":
		err = clientCommand(ctx, os.Args[1], os.Args[2:])
	case "approve", "deny":
		err = decideCommand(ctx, os.Args[1], os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "convlog: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		fmt.Fprintln(os.Stderr, "convlog:", ee.msg)
		os.Exit(ee.code)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "convlog:", err)
		os.Exit(1)
	}
}

// versionString is "convlog VERSION (commit REV[, modified])".
func versionString() string {
	commit, modified := "unknown", false
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if modified {
		commit += ", modified"
	}
	return fmt.Sprintf("convlog %s (commit %s)", version, commit)
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: convlog <command> [flags]

commands:
  serve      run the service (HTTP API, log, embedded NATS, workers)
  worker     run agents for a service on other machines, over NATS
  version    print the version and commit
  backup     copy the log while the service runs (or offline): --to FILE
  restore    put a backup in place of a data folder's log (offline)
  send       AGENT/INSTANCE "text" [--session S] [--follow]: deliver a message
  tail       AGENT/INSTANCE [--from 0|now] [--json]: follow a conversation
  ls         [AGENT]: list agents, or an agent's instances
  approve    AGENT/INSTANCE SUBMISSION [APPROVAL_ID ...] [--input JSON] [--reason R]: approve pending tool calls (all if none named)
  deny       AGENT/INSTANCE SUBMISSION [APPROVAL_ID ...] [--reason R]: deny them

Run 'convlog <command> -h' for its flags.
`)
}
