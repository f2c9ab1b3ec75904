package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/convlog/convlog/transport/wire"
)

// decideCommand is `convlog approve|deny AGENT/INSTANCE SUBMISSION
// [APPROVAL_ID ...]`: it decides the named pending approvals, or all of
// them when none is named, in one request (applied whole or not at all).
func decideCommand(ctx context.Context, verb string, args []string) error {
	approve := verb == "approve"
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	server := serverFlag(fs)
	reason := fs.String("reason", "", "why, stored with the decision (and, for a denial, shown to the model)")
	var input *string
	if approve {
		input = fs.String("input", "", "edited tool arguments, a JSON object, used instead of the model's (with one approval)")
	}
	idem := fs.String("idempotency-key", "", "an Idempotency-Key, so that running the same command again decides nothing new")
	asJSON := fs.Bool("json", false, "print the 202 body")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return fmt.Errorf("%s: usage: convlog %s AGENT/INSTANCE SUBMISSION [APPROVAL_ID ...] [--reason R]", verb, verb)
	}
	agent, instance, err := splitTarget(pos[0])
	if err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	c := cliClient(*server)
	ids := pos[2:]
	if len(ids) == 0 {
		sub, err := c.Submission(ctx, agent, instance, pos[1], 0)
		if err != nil {
			return fmt.Errorf("%s: %w", verb, err)
		}
		for _, p := range sub.Pending {
			ids = append(ids, p.ApprovalID)
		}
		if len(ids) == 0 {
			return fmt.Errorf("%s: submission %s waits for no approval (status %s)", verb, pos[1], sub.Status)
		}
	}
	var edited json.RawMessage
	if input != nil && *input != "" {
		if len(ids) != 1 {
			return fmt.Errorf("%s: --input edits one call's arguments: name one approval id", verb)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(*input), &obj); err != nil {
			return errors.New(verb + ": --input must be a JSON object: " + err.Error())
		}
		edited = json.RawMessage(*input)
	}
	decisions := make([]wire.Decision, len(ids))
	for i, id := range ids {
		decisions[i] = wire.Decision{ApprovalID: id, Approved: approve, Reason: *reason, Input: edited}
	}
	d, err := c.Decide(ctx, agent, instance, pos[1], decisions, *idem)
	if err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	if *asJSON {
		printJSON(os.Stdout, d)
		return nil
	}
	word := "approved"
	if !approve {
		word = "denied"
	}
	fmt.Fprintf(os.Stderr, "%s %d; %d still pending; decisions at offset %s\n", word, len(ids), len(d.Pending), d.Offset)
	return nil
}
