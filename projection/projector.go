package projection

import (
	"bytes"
	"encoding/json"

	"github.com/convlog/convlog/log/record"
)

// Project is the view of records, read from the start of a stream. It is a
// Projector fed everything at once, so that the two can never disagree.
func Project(records []record.Record) View {
	p := NewProjector()
	p.Apply(records...)
	return p.View()
}

// Projector keeps a view up to date as records arrive, so that a reader
// tailing a stream does not re-project it from the start on every batch.
// Feeding records in any number of Apply calls gives the view Project gives
// for all of them at once.
//
// Appending an entry costs O(1) amortized. Moving the path (a truncation, a
// branch) costs O(k) for the k entries that leave or join it: each entry on
// the path remembers what it changed, so leaving undoes exactly that and
// nothing is rebuilt from the start. The Projector keeps every entry it has
// seen, since any of them can rejoin the path.
//
// A Projector is not safe for concurrent use.
type Projector struct {
	// nodes is every entry seen, for rejoining a branch that left the path.
	nodes map[string]*node
	// path is the active path, root first; onPath indexes it by entry id.
	path   []frame
	onPath map[string]int

	messages []Message
	// calls locates, per tool call id, the tool parts on the path in path
	// order; a result goes to the last.
	calls map[string][]partRef

	settlements []record.Settlement
	settled     map[string]bool
}

type node struct {
	entry record.Entry
	// parent is where the entry joined the tree: its ParentID, or the leaf
	// at the time when that parent was never seen.
	parent string
}

// frame is an entry on the path and what it did to the messages, so that
// taking it off the path undoes exactly that.
type frame struct {
	node   *node
	msg    int     // index of the entry's message, or -1
	result *undone // the tool part the entry's result overwrote, if any
}

type partRef struct{ msg, part int }

type undone struct {
	at   partRef
	prev Part
}

// NewProjector returns a Projector at the start of a stream.
func NewProjector() *Projector {
	return &Projector{
		nodes:   make(map[string]*node),
		onPath:  make(map[string]int),
		calls:   make(map[string][]partRef),
		settled: make(map[string]bool),
	}
}

// Apply advances the view by records, in order.
func (p *Projector) Apply(records ...record.Record) {
	for i := range records {
		switch r := &records[i]; r.Kind {
		case record.KindEntry:
			p.entry(r.Entry)
		case record.KindTruncated:
			if leaf, ok := truncationLeaf(r, p.known); ok {
				p.checkout(leaf)
			}
		}
	}
}

// View returns the current view. It shares no memory with the Projector, so
// later Apply calls leave it as it is; the price is a copy of the whole view
// per call.
func (p *Projector) View() View {
	v := View{
		Messages:    make([]Message, len(p.messages)),
		Settlements: make([]record.Settlement, len(p.settlements)),
	}
	for i, m := range p.messages {
		v.Messages[i] = m.clone()
	}
	for i, s := range p.settlements {
		v.Settlements[i] = cloneSettlement(s)
	}
	return v
}

func (p *Projector) known(id string) bool { return p.nodes[id] != nil }

func (p *Projector) leaf() string {
	if len(p.path) == 0 {
		return ""
	}
	return p.path[len(p.path)-1].node.entry.ID
}

func (p *Projector) entry(e *record.Entry) {
	if e == nil || e.ID == "" || p.known(e.ID) {
		return
	}
	n := &node{entry: *e, parent: e.ParentID}
	// The payload may be replayed long after Apply returned, when a branch
	// rejoins the path; the caller's bytes are not ours to keep.
	n.entry.Payload = bytes.Clone(e.Payload)
	if n.parent != "" && !p.known(n.parent) {
		n.parent = p.leaf()
	}
	p.nodes[e.ID] = n
	p.checkout(n.parent)
	p.push(n)
	if e.Type == record.EntrySettlement {
		p.settle(&n.entry)
	}
}

// checkout makes leaf ("" or a known entry) the end of the path: it pops the
// path back to the deepest ancestor of leaf on it, then pushes the rest of
// leaf's ancestors.
func (p *Projector) checkout(leaf string) {
	if leaf == p.leaf() {
		return
	}
	var rejoin []*node
	depth := 0
	for id := leaf; id != ""; {
		if i, ok := p.onPath[id]; ok {
			depth = i + 1
			break
		}
		n := p.nodes[id]
		rejoin = append(rejoin, n)
		id = n.parent
	}
	for len(p.path) > depth {
		p.pop()
	}
	for i := len(rejoin) - 1; i >= 0; i-- {
		p.push(rejoin[i])
	}
}

func (p *Projector) push(n *node) {
	f := frame{node: n, msg: -1}
	e := &n.entry
	switch e.Type {
	case record.EntryUserMessage, record.EntryAssistantMessage:
		var pl record.MessagePayload
		if json.Unmarshal(e.Payload, &pl) != nil {
			break
		}
		role, purpose := RoleUser, record.PurposeUser
		if e.Type == record.EntryAssistantMessage {
			role, purpose = RoleAssistant, record.PurposeAssistant
		}
		f.msg = len(p.messages)
		m := newMessage(e, &pl, role, purpose)
		for j, part := range m.Parts {
			if part.Type == PartTool {
				p.calls[part.ToolCallID] = append(p.calls[part.ToolCallID], partRef{f.msg, j})
			}
		}
		p.messages = append(p.messages, m)
	case record.EntryToolResult:
		var r record.ToolResultPayload
		if json.Unmarshal(e.Payload, &r) != nil {
			break
		}
		refs := p.calls[r.ToolCallID]
		if len(refs) == 0 {
			break
		}
		at := refs[len(refs)-1]
		part := &p.messages[at.msg].Parts[at.part]
		f.result = &undone{at: at, prev: *part}
		*part = part.withResult(&r)
	}
	p.onPath[e.ID] = len(p.path)
	p.path = append(p.path, f)
}

// pop takes the leaf off the path, undoing what pushing it did. Frames
// above it are gone already, so the messages end with its own.
func (p *Projector) pop() {
	f := p.path[len(p.path)-1]
	p.path[len(p.path)-1] = frame{}
	p.path = p.path[:len(p.path)-1]
	delete(p.onPath, f.node.entry.ID)
	if f.result != nil {
		p.messages[f.result.at.msg].Parts[f.result.at.part] = f.result.prev
	}
	if f.msg >= 0 {
		parts := p.messages[f.msg].Parts
		for j := len(parts) - 1; j >= 0; j-- {
			if parts[j].Type != PartTool {
				continue
			}
			id := parts[j].ToolCallID
			if refs := p.calls[id]; len(refs) > 1 {
				p.calls[id] = refs[:len(refs)-1]
			} else {
				delete(p.calls, id)
			}
		}
		p.messages[f.msg] = Message{}
		p.messages = p.messages[:f.msg]
	}
}

// settle records a settlement unless its submission already has one. A
// payload without a submission id falls back to the entry's.
func (p *Projector) settle(e *record.Entry) {
	var s record.Settlement
	if json.Unmarshal(e.Payload, &s) != nil {
		return
	}
	if s.SubmissionID == "" {
		s.SubmissionID = e.SubmissionID
	}
	if s.SubmissionID == "" || s.Outcome == "" || p.settled[s.SubmissionID] {
		return
	}
	p.settled[s.SubmissionID] = true
	p.settlements = append(p.settlements, s)
}
