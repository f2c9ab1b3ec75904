package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/convlog/convlog/internal/datadir"
	clog "github.com/convlog/convlog/log"
)

// backupCommand is `convlog backup --to FILE [--data DIR] [--server URL]`.
// A running service holds the bbolt file's lock, so the copy of a live log
// comes from the service itself (POST /admin/backup, one read transaction
// streamed out); a log no process has open is copied directly.
func backupCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	to := fs.String("to", "", "the file to write the copy to (required)")
	data := fs.String("data", "", "the service's data folder: copied directly when no process holds it, else through --server")
	server := serverFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *to == "" || fs.NArg() > 0 {
		return errors.New("backup: usage: convlog backup --to FILE [--data DIR] [--server URL]")
	}
	tmp := *to + ".partial"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(tmp) // after the rename, a no-op
	var n int64
	var via string
	begin := func(size int64) (io.Writer, error) { return f, nil }
	if *data != "" {
		via = "offline copy of " + filepath.Join(*data, "convlog.db")
		n, err = clog.BackupFile(filepath.Join(*data, "convlog.db"), begin)
	}
	if *data == "" || errors.Is(err, clog.ErrLocked) {
		if *data != "" && !flagSet(fs, "server") {
			// The folder's holder says where it listens.
			if h, herr := datadir.Holder(*data); herr == nil && h != nil && h.Listen != "" {
				*server = localURL(h.Listen)
			}
		}
		via = "the service at " + *server
		n, err = backupFromServer(ctx, *server, f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, *to); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Printf("backup: %d bytes written to %s (%s)\n", n, *to, via)
	return nil
}

func backupFromServer(ctx context.Context, server string, w io.Writer) (int64, error) {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(server, "/")+"/admin/backup", nil)
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	resp, err := cliHTTP().Do(req)
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("backup: %s answered %s: %s", server, resp.Status, strings.TrimSpace(string(body)))
	}
	want, err := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	if err != nil {
		return 0, errors.New("backup: the service sent no Content-Length; cannot tell a complete copy")
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("backup: after %d of %d bytes: %w", n, want, err)
	}
	if n != want {
		return n, fmt.Errorf("backup: cut short at %d of %d bytes", n, want)
	}
	return n, nil
}

// restoreCommand is `convlog restore --from FILE --data DIR`: offline, with
// no service running on DIR.
func restoreCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	from := fs.String("from", "", "a file written by convlog backup (required)")
	data := fs.String("data", "./data", "the data folder to restore into; no service may be running on it")
	keep := fs.Bool("keep-incarnations", false, "keep the streams' incarnations as in the backup (readers holding offsets from after the backup would take restored records for the ones they knew)")
	replace := fs.Bool("replace", false, "replace an existing log in --data")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" || fs.NArg() > 0 {
		return errors.New("restore: usage: convlog restore --from FILE [--data DIR] [--keep-incarnations] [--replace]")
	}
	src, err := os.Open(*from)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer src.Close()
	dst := filepath.Join(*data, "convlog.db")
	res, err := clog.Restore(ctx, src, dst, clog.RestoreOptions{KeepIncarnations: *keep, Replace: *replace})
	if err != nil {
		return err
	}
	if err := datadir.MarkRestored(*data); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	fmt.Printf("restore: %d bytes into %s; %d streams, %d given a new incarnation\n", res.Bytes, dst, res.Streams, res.Renewed)
	return nil
}

// flagSet says whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// localURL is the URL this machine reaches a listen address at: a
// wildcard host is reached over loopback.
func localURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
