package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

// maxTurnBytes bounds the stored size of the user messages one turn
// answers (the first is always taken, whatever its size). A reply tends to
// be as large as what it answers, and an agent holds its whole prompt in
// memory: half a log batch leaves room for an echo of the prompt and the
// turn's settlements. The rest wait for the next turn.
const maxTurnBytes = record.MaxBatchBytes / 2

// maxMessagePiece bounds the text (and tool inputs) of one stored
// assistant_message entry; a longer reply is stored as several entries of
// the turn, in order. JSON escaping can grow text up to six times, so a
// piece always fits in one batch.
const maxMessagePiece = 2 << 20

// gatherTurn gives t the admitted submissions, in order, that it answers:
// no more than maxTurnBytes of messages after the first, and reads their
// prompt. A submission whose message cannot be read ends the turn before
// it; if it is the first, the turn answers it alone, failed.
//
// It reads with the pool's context, not a turn's: an abort must not make
// the prompt unreadable.
func (p *Pool) gatherTurn(t *turn, subs []record.Submission) {
	var texts []string
	size := 0
	for i, s := range subs {
		m, err := p.readMessage(p.turnsCtx, t.key, s)
		if err != nil {
			if i == 0 {
				t.subs, t.promptErr = subs[:1], err
				return
			}
			subs = subs[:i]
			break
		}
		if i > 0 && size+m.size > maxTurnBytes {
			subs = subs[:i]
			break
		}
		if i == 0 {
			t.principal = m.principal
		}
		size += m.size
		texts = append(texts, m.text)
		t.prompt.Images = append(t.prompt.Images, m.images...)
	}
	t.subs = subs
	t.prompt.Text = strings.Join(texts, "\n\n")
}

// resume makes t continue its submission from a decided wait: the agent
// gets the decisions (Prompt.Resume), and the tool calls they name are
// the turn's, so that their results are taken. The submission's
// approvals, read before its Start, are final: Start succeeds only while
// every request is decided, and a decided request never changes.
func (t *turn) resume() {
	s := t.subs[0]
	if !s.Resumable() {
		return
	}
	r := &worker.Resume{Decisions: make([]worker.Decision, 0, len(s.Approvals))}
	for _, a := range s.Approvals {
		r.Decisions = append(r.Decisions, worker.Decision{
			ApprovalID: a.ApprovalID, ToolCallID: a.ToolCallID, ToolName: a.ToolName, Args: a.Input,
			Approved: a.Approved, Reason: a.Reason, Input: a.EditedInput,
		})
		if t.toolNames == nil {
			t.toolNames = map[string]string{}
		}
		t.toolNames[a.ToolCallID] = a.ToolName
	}
	t.prompt.Resume = r
}

// readPrompt reads the prompt of the submissions t already answers.
func (p *Pool) readPrompt(t *turn) {
	var texts []string
	for i, s := range t.subs {
		m, err := p.readMessage(p.turnsCtx, t.key, s)
		if err != nil {
			t.prompt, t.promptErr = worker.Prompt{}, err
			return
		}
		if i == 0 {
			t.principal = m.principal
		}
		texts = append(texts, m.text)
		t.prompt.Images = append(t.prompt.Images, m.images...)
	}
	t.prompt.Text = strings.Join(texts, "\n\n")
}

// message is what a turn takes of a submission's user entry.
type message struct {
	text      string
	images    []worker.Image
	size      int               // of the stored batch that holds it
	principal *worker.Principal // who delivered it
}

// readMessage reads the text and images of a submission's user entry.
func (p *Pool) readMessage(ctx context.Context, key record.Key, s record.Submission) (message, error) {
	res, err := p.cfg.Log.Read(ctx, key, s.Offset, 1)
	if err != nil {
		return message{}, fmt.Errorf("read submission %s: %w", s.ID, err)
	}
	if len(res.Batches) == 0 {
		return message{}, fmt.Errorf("submission %s: no records at its offset", s.ID)
	}
	batch := res.Batches[0]
	// Only the entry's id and payload: a prompt is read for every
	// submission a turn answers, and decoding whole records twice (the
	// record, then its payload) was a tenth of a loaded service's CPU.
	var recs []struct {
		Kind  string `json:"kind"`
		Entry *struct {
			ID      string          `json:"id"`
			Payload json.RawMessage `json:"payload"`
		} `json:"entry"`
	}
	if err := json.Unmarshal(batch.Records, &recs); err != nil {
		return message{}, fmt.Errorf("submission %s: records: %w", s.ID, err)
	}
	m := message{size: len(batch.Records)}
	var texts []string
	for _, r := range recs {
		if r.Kind != record.KindEntry || r.Entry == nil || r.Entry.ID != s.EntryID {
			continue
		}
		var msg record.MessagePayload
		if err := json.Unmarshal(r.Entry.Payload, &msg); err != nil {
			return message{}, fmt.Errorf("submission %s: payload: %w", s.ID, err)
		}
		m.principal = principalOf(msg.Metadata)
		var b strings.Builder
		for _, part := range msg.Parts {
			switch part.Type {
			case record.PartText:
				b.WriteString(part.Text)
			case record.PartFile:
				if img, ok := dataURLImage(part); ok {
					m.images = append(m.images, img)
				}
			}
		}
		texts = append(texts, b.String())
	}
	m.text = strings.Join(texts, "\n\n")
	return m, nil
}

// addText adds a delta to the assistant message being streamed, storing
// the message as a piece whenever it reaches maxMessagePiece, so that no
// reply is too large for the log.
func (t *turn) addText(ctx context.Context, typ, delta string) error {
	for len(delta) > 0 {
		n := min(len(delta), maxMessagePiece-t.partBytes)
		for n > 0 && n < len(delta) && !utf8.RuneStart(delta[n]) {
			n-- // a piece ends between runes
		}
		if n > 0 {
			t.appendText(typ, delta[:n])
			t.partBytes += n
			delta = delta[n:]
		}
		if t.partBytes >= maxMessagePiece || (n == 0 && (len(t.parts) > 0 || t.text.Len() > 0)) {
			if err := t.flushMessage(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}
