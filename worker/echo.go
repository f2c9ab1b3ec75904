package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"time"
)

// Echo is the built-in agent: it streams the prompt back word by word, one
// text delta every Delay, then completes. It lets the service be tried, and
// measured, without a model.
//
// A line of the prompt that starts with one of these commands is acted on
// instead of echoed, so that every event of the contract (and so every
// frame and record of the protocol) can be produced on demand:
//
//	/think TEXT             thinking deltas (a reasoning part), word by word
//	/tool NAME JSON         a tool call: tool_started with JSON as its args,
//	                        then tool_ended with {"echo": JSON}
//	/toolerror NAME JSON    the same, the result marked isError
//	/retry N                N retrying events (attempt 1..N of N+1)
//	/event JSON             JSON as an event of its own (e.g. an unknown
//	                        type, relayed unchanged to live readers)
//	/sleep DURATION         waits, e.g. /sleep 2s (cancellable)
//	/fail CODE MESSAGE      ends the turn failed, code CODE, not retryable
//	/failretry CODE MESSAGE the same, retryable
//	/complete JSON          ends the turn completed with JSON as its data
//
// Other lines are echoed. A prompt without commands is echoed exactly.
type Echo struct {
	Delay time.Duration
}

// Invoke implements Agent.
func (e Echo) Invoke(ctx context.Context, _ Scope, prompt Prompt) iter.Seq[Event] {
	return func(yield func(Event) bool) {
		var timer *time.Timer
		if e.Delay > 0 {
			timer = time.NewTimer(e.Delay)
			defer timer.Stop()
		}
		wait := func(d time.Duration) bool {
			if d <= 0 {
				return ctx.Err() == nil
			}
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			select {
			case <-ctx.Done():
				return false
			case <-timer.C:
				return true
			}
		}
		n := 0 // events so far: the delay goes between them
		emit := func(ev Event) bool {
			if n > 0 && !wait(e.Delay) {
				return false
			}
			n++
			return ctx.Err() == nil && yield(ev)
		}
		for _, seg := range segments(prompt.Text) {
			if seg.cmd == "" {
				for _, w := range words(seg.text) {
					if !emit(Text(w)) {
						return
					}
				}
				continue
			}
			evs, terminal := echoCommand(seg.cmd, seg.arg)
			for _, ev := range evs {
				if ev.Type == "" { // a sleep
					d, _ := time.ParseDuration(seg.arg)
					if !wait(d) {
						return
					}
					continue
				}
				if !emit(ev) {
					return
				}
			}
			if terminal {
				return
			}
		}
		if ctx.Err() == nil {
			yield(Completed(nil))
		}
	}
}

type segment struct {
	text     string // echoed text, when cmd is ""
	cmd, arg string
}

var echoCommands = map[string]bool{
	"think": true, "tool": true, "toolerror": true, "retry": true, "event": true,
	"sleep": true, "fail": true, "failretry": true, "complete": true,
}

// segments splits s into runs of echoed text and command lines.
func segments(s string) []segment {
	var out []segment
	var text strings.Builder
	for len(s) > 0 {
		line := s
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			line = s[:i+1]
		}
		s = s[len(line):]
		name, arg, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		if cmd, ok := strings.CutPrefix(name, "/"); ok && echoCommands[cmd] {
			if text.Len() > 0 {
				out = append(out, segment{text: text.String()})
				text.Reset()
			}
			out = append(out, segment{cmd: cmd, arg: strings.TrimSpace(arg)})
			continue
		}
		text.WriteString(line)
	}
	if text.Len() > 0 {
		out = append(out, segment{text: text.String()})
	}
	return out
}

// echoCommand is the events of one command; an Event with no type is a
// pause. terminal says the turn ends with them.
func echoCommand(cmd, arg string) (evs []Event, terminal bool) {
	jsonArg := func(s string) json.RawMessage {
		if json.Valid([]byte(s)) {
			return json.RawMessage(s)
		}
		b, _ := json.Marshal(s) // not JSON: taken as a string
		return b
	}
	switch cmd {
	case "think":
		for _, w := range words(arg) {
			evs = append(evs, Thinking(w))
		}
	case "tool", "toolerror":
		name, args, _ := strings.Cut(arg, " ")
		if args == "" {
			args = "{}"
		}
		id := "call_" + strconv.FormatInt(time.Now().UnixNano(), 36)
		out, _ := json.Marshal(map[string]json.RawMessage{"echo": jsonArg(args)})
		evs = append(evs, ToolStarted(id, name, jsonArg(args)), ToolEnded(id, cmd == "toolerror", out))
	case "retry":
		n, _ := strconv.Atoi(arg)
		for i := 1; i <= n; i++ {
			evs = append(evs, Event{Type: EventRetrying, Attempt: i, MaxAttempts: n + 1, DelayMs: 0, Reason: fmt.Sprintf("echo: simulated retry %d of %d", i, n)})
		}
	case "event":
		var ev Event
		raw := jsonArg(arg)
		if json.Unmarshal(raw, &ev) != nil || ev.Type == "" {
			return []Event{Failed("/event needs a JSON object with a type", false, "bad_command")}, true
		}
		ev.Raw = raw
		terminal = ev.Type == EventCompleted || ev.Type == EventFailed
		evs = append(evs, ev)
	case "sleep":
		evs = append(evs, Event{})
	case "fail", "failretry":
		code, msg, _ := strings.Cut(arg, " ")
		if code == "" {
			code = "echo_failed"
		}
		return []Event{Failed(msg, cmd == "failretry", code)}, true
	case "complete":
		var data json.RawMessage
		if arg != "" {
			data = jsonArg(arg)
		}
		return []Event{Completed(data)}, true
	}
	return evs, terminal
}

// words splits s into words that keep their trailing white space, so that
// the deltas concatenate back to s exactly.
func words(s string) []string {
	var out []string
	for len(s) > 0 {
		i := strings.IndexAny(s, " \t\n")
		if i < 0 {
			out = append(out, s)
			break
		}
		j := i
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n') {
			j++
		}
		out = append(out, s[:j])
		s = s[j:]
	}
	return out
}
