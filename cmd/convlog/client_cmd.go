package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// exitError ends the process with a status other than 1, for the verbs
// whose status says how something ended (send --follow).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Exit statuses of `convlog send --follow`.
const (
	exitCompleted = 0
	exitFailed    = 1
	exitAborted   = 2
)

func clientCommand(ctx context.Context, verb string, args []string) error {
	switch verb {
	case "send":
		return sendCommand(ctx, args)
	case "tail":
		return tailCommand(ctx, args)
	default:
		return lsCommand(ctx, args)
	}
}

// splitTarget reads AGENT/INSTANCE.
func splitTarget(s string) (agent, instance string, err error) {
	agent, instance, ok := strings.Cut(s, "/")
	if !ok || agent == "" || instance == "" || strings.Contains(instance, "/") {
		return "", "", fmt.Errorf("want AGENT/INSTANCE, got %q", s)
	}
	return agent, instance, nil
}

// sendCommand is `convlog send AGENT/INSTANCE "text" [--session S] [--follow]`.
func sendCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	server := serverFlag(fs)
	session := fs.String("session", "", "the session (default \"default\")")
	follow := fs.Bool("follow", false, "stream the answer as it is written; exit 0 completed, 1 failed, 2 aborted")
	idem := fs.String("idempotency-key", "", "an Idempotency-Key, so that running the same command again admits nothing new")
	asJSON := fs.Bool("json", false, "print the 202 body (and with --follow, one JSON frame per line)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New(`send: usage: convlog send AGENT/INSTANCE "text" [--session S] [--follow]`)
	}
	agent, instance, err := splitTarget(pos[0])
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	c := cliClient(*server)
	acc, err := c.Deliver(ctx, agent, instance, wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: pos[1]}, Session: *session}, *idem)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if *asJSON {
		printJSON(os.Stdout, acc)
	} else {
		fmt.Fprintf(os.Stderr, "submission %s admitted at offset %s\n", acc.SubmissionID, acc.Offset)
	}
	if !*follow {
		return nil
	}
	p := &printer{out: os.Stdout, json: *asJSON, until: acc.SubmissionID}
	for u, err := range c.Follow(ctx, agent, instance, client.FollowOptions{Session: *session, Offset: acc.Offset, Deltas: true}) {
		if err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if st := p.update(u); st != nil {
			switch st.Outcome {
			case record.OutcomeCompleted:
				return nil
			case record.OutcomeAborted:
				return &exitError{exitAborted, "send: aborted" + failureText(st.Error)}
			default:
				return &exitError{exitFailed, "send: " + string(st.Outcome) + failureText(st.Error)}
			}
		}
	}
	return ctx.Err()
}

func failureText(f *record.Failure) string {
	if f == nil {
		return ""
	}
	return ": " + f.Code + ": " + f.Message
}

// tailCommand is `convlog tail AGENT/INSTANCE [--from 0|now] [--json]`.
func tailCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	server := serverFlag(fs)
	session := fs.String("session", "", "the session (default \"default\")")
	from := fs.String("from", "0", `where to start: "0" (the whole conversation), "now" (what is written from now on) or an offset`)
	asJSON := fs.Bool("json", false, "one JSON frame per line instead of readable messages")
	inc := fs.String("incarnation", "", "the incarnation --from belongs to: if the conversation has another one now (reset, restored), read it from the start")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("tail: usage: convlog tail AGENT/INSTANCE [--from 0|now] [--json]")
	}
	agent, instance, err := splitTarget(pos[0])
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	c := cliClient(*server)
	offset := record.Offset(*from)
	if *from == "now" {
		if offset, err = tailOffset(ctx, c, agent, instance, *session); err != nil {
			return fmt.Errorf("tail: %w", err)
		}
	}
	p := &printer{out: os.Stdout, json: *asJSON}
	opts := client.FollowOptions{Session: *session, Offset: offset, Incarnation: record.Incarnation(*inc), Deltas: true}
	for u, err := range c.Follow(ctx, agent, instance, opts) {
		if err != nil {
			return fmt.Errorf("tail: %w", err)
		}
		p.update(u)
	}
	return nil // interrupted: the normal end of a tail
}

// tailOffset pages to the end of the session: the offset of what is
// written next.
func tailOffset(ctx context.Context, c *client.Client, agent, instance, session string) (record.Offset, error) {
	off := record.Start
	for {
		res, err := c.Read(ctx, agent, instance, session, off, 10000)
		if err != nil {
			return "", err
		}
		off = res.NextOffset
		if res.UpToDate {
			return off, nil
		}
	}
}

// printer writes what Follow yields, readably or as JSON lines.
type printer struct {
	out   io.Writer
	json  bool
	until string // a submission whose settlement ends the command
	// previewed is set when deltas of the current message were printed:
	// its record then adds only what deltas do not show. preview is their
	// text, to tell whether the deltas showed all of it (a follower that
	// started mid-turn misses the first ones).
	previewed bool
	preview   strings.Builder
}

// update prints u and returns the settlement of p.until if u has it.
func (p *printer) update(u client.Update) *record.Settlement {
	if p.json {
		p.jsonLine(u)
	}
	var done *record.Settlement
	switch u.Kind {
	case client.UpdateBatch:
		for _, r := range u.Records {
			if !p.json {
				p.record(r)
			}
			if r.Kind == record.KindEntry && r.Entry.Type == record.EntrySettlement {
				var st record.Settlement
				if json.Unmarshal(r.Entry.Payload, &st) == nil && st.SubmissionID == p.until && p.until != "" && done == nil {
					done = &st
				}
			}
		}
	case client.UpdateDelta:
		if !p.json && u.DeltaType == "delta" {
			var d struct {
				Kind  string `json:"kind"`
				Delta string `json:"delta"`
			}
			if json.Unmarshal(u.Delta, &d) == nil && d.Kind == "text" {
				if !p.previewed {
					fmt.Fprint(p.out, "assistant: ")
				}
				fmt.Fprint(p.out, d.Delta)
				p.preview.WriteString(d.Delta)
				p.previewed = true
			}
		}
	case client.UpdateReset:
		if !p.json {
			fmt.Fprintf(os.Stderr, "-- the conversation was reset (incarnation %s): reading it again from the start\n", u.Incarnation)
		}
	case client.UpdateReconnecting:
		if !p.json {
			fmt.Fprintf(os.Stderr, "-- reconnecting from offset %s: %v\n", u.NextOffset, u.Err)
		}
	case client.UpdatePolling:
		if !p.json {
			fmt.Fprintf(os.Stderr, "-- streaming failed, polling instead: %v\n", u.Err)
		}
	}
	return done
}

func (p *printer) jsonLine(u client.Update) {
	var v any
	switch u.Kind {
	case client.UpdateBatch:
		v = struct {
			Type        string             `json:"type"`
			Incarnation record.Incarnation `json:"incarnation"`
			Offset      record.Offset      `json:"offset"`
			NextOffset  record.Offset      `json:"nextOffset"`
			Records     []record.Record    `json:"records"`
		}{wire.FrameConversation, u.Incarnation, u.Offset, u.NextOffset, u.Records}
	case client.UpdateDelta:
		fmt.Fprintln(p.out, string(u.Delta))
		return
	default:
		e := ""
		if u.Err != nil {
			e = u.Err.Error()
		}
		v = struct {
			Type        string             `json:"type"`
			Incarnation record.Incarnation `json:"incarnation,omitempty"`
			NextOffset  record.Offset      `json:"nextOffset,omitempty"`
			Error       string             `json:"error,omitempty"`
		}{string(u.Kind), u.Incarnation, u.NextOffset, e}
	}
	printJSON(p.out, v)
}

// printJSON writes v on one line, URLs and markup as they are.
func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func (p *printer) record(r record.Record) {
	switch r.Kind {
	case record.KindTruncated:
		fmt.Fprintf(p.out, "-- rewound to %s (%s)\n", r.RewoundTo, r.Reason)
		return
	case record.KindEntry:
	default:
		return
	}
	e := r.Entry
	switch e.Type {
	case record.EntryUserMessage, record.EntryAssistantMessage:
		var m record.MessagePayload
		if json.Unmarshal(e.Payload, &m) != nil {
			return
		}
		role := "user"
		if e.Type == record.EntryAssistantMessage {
			role = "assistant"
		}
		previewed := p.previewed && role == "assistant"
		shown := p.preview.String()
		p.previewed = false
		p.preview.Reset()
		if previewed {
			fmt.Fprintln(p.out) // the text is on screen already
			var text strings.Builder
			for _, part := range m.Parts {
				if part.Type == record.PartText {
					text.WriteString(part.Text)
				}
			}
			// Unless the deltas missed some: then the whole message, as stored.
			previewed = text.String() == shown
		}
		for _, part := range m.Parts {
			switch part.Type {
			case record.PartText:
				if !previewed {
					fmt.Fprintf(p.out, "%s: %s\n", role, part.Text)
				}
			case record.PartReasoning:
				if !previewed {
					fmt.Fprintf(p.out, "%s (thinking): %s\n", role, part.Text)
				}
			case record.PartToolCall:
				fmt.Fprintf(p.out, "%s calls %s(%s) [%s]\n", role, part.ToolName, part.Input, part.ToolCallID)
			case record.PartData:
				fmt.Fprintf(p.out, "%s data %s: %s\n", role, part.Name, part.Data)
			case record.PartFile:
				fmt.Fprintf(p.out, "%s file %s (%s)\n", role, part.Filename, part.MediaType)
			}
		}
	case record.EntryToolResult:
		var t record.ToolResultPayload
		if json.Unmarshal(e.Payload, &t) == nil {
			status := "ok"
			if t.IsError {
				status = "error"
			}
			fmt.Fprintf(p.out, "tool %s [%s] %s: %s\n", t.ToolName, t.ToolCallID, status, t.Output)
		}
	case record.EntrySettlement:
		var st record.Settlement
		if json.Unmarshal(e.Payload, &st) == nil {
			fmt.Fprintf(p.out, "-- %s %s%s\n", st.SubmissionID, st.Outcome, failureText(st.Error))
		}
	}
}

// lsCommand is `convlog ls [AGENT]`: the agents served, or an agent's
// instances, from the listing routes.
func lsCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ls", flag.ContinueOnError)
	server := serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the listing's JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return errors.New("ls: usage: convlog ls [AGENT]")
	}
	base := strings.TrimRight(cliClient(*server).BaseURL, "/")
	if len(pos) == 0 {
		var body struct {
			Agents []struct {
				Name string `json:"name"`
				Kind string `json:"kind"`
				Busy string `json:"busy"`
			} `json:"agents"`
		}
		raw, err := getJSON(ctx, base+"/agents", &body)
		if err != nil {
			return fmt.Errorf("ls: %w", err)
		}
		if *asJSON {
			fmt.Println(strings.TrimSpace(string(raw)))
			return nil
		}
		for _, a := range body.Agents {
			fmt.Printf("%s\t%s\t%s\n", a.Name, a.Kind, a.Busy)
		}
		return nil
	}
	cursor := ""
	for {
		u := base + "/agents/" + url.PathEscape(pos[0])
		if cursor != "" {
			u += "?cursor=" + url.QueryEscape(cursor)
		}
		var body struct {
			Instances []struct {
				InstanceID     string    `json:"instanceId"`
				LastActivityAt time.Time `json:"lastActivityAt"`
				UID            string    `json:"uid"`
				Sessions       []string  `json:"sessions"`
			} `json:"instances"`
			NextCursor string `json:"nextCursor"`
		}
		raw, err := getJSON(ctx, u, &body)
		if err != nil {
			return fmt.Errorf("ls: %w", err)
		}
		if *asJSON {
			fmt.Println(strings.TrimSpace(string(raw)))
		} else {
			for _, in := range body.Instances {
				fmt.Printf("%s\t%s\t%s\n", in.InstanceID, in.LastActivityAt.Format(time.RFC3339), strings.Join(in.Sessions, ","))
			}
		}
		if body.NextCursor == "" || len(body.Instances) == 0 {
			return nil
		}
		cursor = body.NextCursor
	}
}

// getJSON GETs u into v and returns the raw body.
func getJSON(ctx context.Context, u string, v any) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := cliHTTP().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(raw)))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%s: %w", u, err)
	}
	return raw, nil
}
