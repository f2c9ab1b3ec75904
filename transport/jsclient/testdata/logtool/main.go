// Command logtool changes one conversation's stream in a stopped convlog's
// data folder, through the log engine itself. The JS client's tests use it
// to produce what no HTTP route produces yet: an incarnation change
// (log.DB.Reset) and a truncated record (a rewind). It lives under testdata
// so that no product build includes it.
//
//	logtool reset  DATA AGENT INSTANCE SESSION          prints the new incarnation
//	logtool rewind DATA AGENT INSTANCE SESSION ENTRYID  appends truncated{rewoundTo: ENTRYID}
//	logtool import DATA AGENT INSTANCE SESSION FILE     appends FILE's records (a JSON array), one batch each
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "logtool:", err)
		os.Exit(1)
	}
}

func run(args []string) (err error) {
	if len(args) < 5 {
		return fmt.Errorf("usage: logtool reset|rewind|import DATA AGENT INSTANCE SESSION [ENTRYID]")
	}
	db, err := log.Open(filepath.Join(args[1], "convlog.db"), nil)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := db.Close(); err == nil {
			err = cerr
		}
	}()
	ctx := context.Background()
	key := record.Key{Agent: args[2], Instance: args[3], Session: args[4]}
	switch {
	case args[0] == "reset" && len(args) == 5:
		inc, err := db.Reset(ctx, key)
		if err != nil {
			return err
		}
		fmt.Println(inc)
	case args[0] == "rewind" && len(args) == 6:
		if _, err := db.Append(ctx, key, record.TruncatedRecord(args[5], "rewind")); err != nil {
			return err
		}
	case args[0] == "import" && len(args) == 6:
		b, err := os.ReadFile(args[5])
		if err != nil {
			return err
		}
		var records []record.Record
		if err := json.Unmarshal(b, &records); err != nil {
			return fmt.Errorf("%s: %w", args[5], err)
		}
		for _, r := range records {
			if _, err := db.Append(ctx, key, r); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown verb or wrong arguments: %q", args)
	}
	return nil
}
