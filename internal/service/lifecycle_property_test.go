package service

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/convlog/convlog/log/record"
)

// lifeModel is the test's idea of what the service holds: per conversation
// ("instance/session"), the messages of the active path and the
// submissions admitted to it in its current incarnation.
type lifeModel struct {
	convs map[string]*modelConv
	gone  map[string]bool // conversations deleted and not recreated
}

type modelConv struct {
	instance, session string
	msgs              []msg
	subs              []string
}

func (m *lifeModel) keys() []string {
	ks := make([]string, 0, len(m.convs))
	for k := range m.convs {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// userIndex is the index in msgs of the j-th user message.
func userIndex(msgs []msg, j int) int {
	for i, m := range msgs {
		if m.Role == "user" {
			if j == 0 {
				return i
			}
			j--
		}
	}
	return -1
}

func userCount(msgs []msg) int {
	n := 0
	for _, m := range msgs {
		if m.Role == "user" {
			n++
		}
	}
	return n
}

// TestLifecycleProperty drives random deliveries, rewinds, regenerations,
// forks, resets and deletes against one running service and checks after
// every step that a fresh read of every conversation projects to the
// model's active path, that every submission of the model has exactly one
// settlement in its conversation and that no submission is settled twice
// anywhere.
func TestLifecycleProperty(t *testing.T) {
	svc, _ := testService(t, nil)
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		r := raw{rt, "http://" + svc.Addr()}
		m := &lifeModel{convs: map[string]*modelConv{}, gone: map[string]bool{}}
		instances := []string{fmt.Sprintf("p%d-a", run), fmt.Sprintf("p%d-b", run)}
		sessions := []string{"default", "s1"}
		forks := 0
		pickConv := func(rt *rapid.T, pred func(*modelConv) bool) *modelConv {
			var ks []string
			for _, k := range m.keys() {
				if pred(m.convs[k]) {
					ks = append(ks, k)
				}
			}
			if len(ks) == 0 {
				rt.Skip("no conversation fits")
			}
			return m.convs[rapid.SampledFrom(ks).Draw(rt, "conversation")]
		}
		path := func(c *modelConv) string { return "/agents/echo/" + c.instance }
		q := func(c *modelConv) string { return "?session=" + c.session }
		rt.Repeat(map[string]func(*rapid.T){
			"deliver": func(rt *rapid.T) {
				inst := rapid.SampledFrom(instances).Draw(rt, "instance")
				sess := rapid.SampledFrom(sessions).Draw(rt, "session")
				text := rapid.StringMatching(`[a-z]{1,6}( [a-z]{1,6}){0,2}`).Draw(rt, "text")
				k := inst + "/" + sess
				c := m.convs[k]
				if c == nil {
					c = &modelConv{instance: inst, session: sess}
					m.convs[k] = c
					delete(m.gone, k)
				}
				acc := r.deliver(inst, sess, text)
				if s := r.settled(inst, acc.SubmissionID); s.Status != record.StatusCompleted {
					rt.Fatalf("delivery %+v", s)
				}
				c.msgs = append(c.msgs, msg{"user", text}, msg{"assistant", text})
				c.subs = append(c.subs, acc.SubmissionID)
			},
			"rewind": func(rt *rapid.T) {
				c := pickConv(rt, func(c *modelConv) bool { return userCount(c.msgs) > 0 })
				j := rapid.IntRange(0, userCount(c.msgs)-1).Draw(rt, "checkpoint")
				cps := r.checkpoints(c.instance, c.session)
				if len(cps) != userCount(c.msgs) {
					rt.Fatalf("%d checkpoints, model has %d user messages", len(cps), userCount(c.msgs))
				}
				r.must(200, "POST", path(c)+"/rewind"+q(c), `{"entryId":"`+cps[j].EntryID+`"}`, nil)
				c.msgs = c.msgs[:userIndex(c.msgs, j)]
			},
			"regenerate": func(rt *rapid.T) {
				c := pickConv(rt, func(c *modelConv) bool { return userCount(c.msgs) > 0 })
				n := userCount(c.msgs)
				j := rapid.IntRange(-1, n-1).Draw(rt, "checkpoint") // -1: the default, the last
				body := ""
				if j >= 0 {
					body = `{"entryId":"` + r.checkpoints(c.instance, c.session)[j].EntryID + `"}`
				} else {
					j = n - 1
				}
				var acc accepted
				r.must(202, "POST", path(c)+"/regenerate"+q(c), body, &acc)
				if s := r.settled(c.instance, acc.SubmissionID); s.Status != record.StatusCompleted {
					rt.Fatalf("regenerated %+v", s)
				}
				i := userIndex(c.msgs, j)
				u := c.msgs[i]
				c.msgs = append(c.msgs[:i:i], u, msg{"assistant", u.Text})
				c.subs = append(c.subs, acc.SubmissionID)
			},
			"fork": func(rt *rapid.T) {
				c := pickConv(rt, func(c *modelConv) bool { return len(c.msgs) > 0 })
				k := rapid.IntRange(0, len(c.msgs)-1).Draw(rt, "message")
				_, recs := r.fresh(c.instance, c.session)
				ids := projectionIDs(recs)
				forks++
				target := &modelConv{instance: c.instance, session: fmt.Sprintf("fork%d", forks)}
				body := `{"entryId":"` + ids[k] + `","session":"` + target.session + `"}`
				if rapid.Bool().Draw(rt, "newInstance") {
					target.instance, target.session = fmt.Sprintf("p%d-f%d", run, forks), "default"
					instances = append(instances, target.instance)
					body = `{"entryId":"` + ids[k] + `","instanceId":"` + target.instance + `"}`
				}
				r.must(201, "POST", path(c)+"/fork"+q(c), body, nil)
				target.msgs = slices.Clone(c.msgs[:k+1])
				m.convs[target.instance+"/"+target.session] = target
			},
			"reset": func(rt *rapid.T) {
				c := pickConv(rt, func(*modelConv) bool { return true })
				r.must(200, "POST", path(c)+"/reset"+q(c), "", nil)
				c.msgs, c.subs = nil, nil
			},
			"delete": func(rt *rapid.T) {
				c := pickConv(rt, func(*modelConv) bool { return true })
				r.must(200, "DELETE", path(c), "", nil)
				for k, o := range m.convs {
					if o.instance == c.instance {
						delete(m.convs, k)
						m.gone[k] = true
					}
				}
			},
			"": func(rt *rapid.T) {
				checkModel(rt, r, m)
			},
		})
	})
}

func checkModel(rt *rapid.T, r raw, m *lifeModel) {
	for _, k := range m.keys() {
		c := m.convs[k]
		_, recs := r.fresh(c.instance, c.session)
		want := c.msgs
		if want == nil {
			want = []msg{}
		}
		if got := messagesOf(recs); !reflect.DeepEqual(got, want) {
			rt.Fatalf("%s: projection %v, model %v", k, got, want)
		}
		settled := map[string]int{}
		for _, rec := range recs {
			if rec.Kind == record.KindEntry && rec.Entry.Type == record.EntrySettlement {
				var st record.Settlement
				if err := json.Unmarshal(rec.Entry.Payload, &st); err != nil {
					rt.Fatal(err)
				}
				settled[st.SubmissionID]++
			}
		}
		for id, n := range settled {
			if n > 1 {
				rt.Fatalf("%s: submission %s settled %d times", k, id, n)
			}
		}
		for _, id := range c.subs {
			if settled[id] != 1 {
				rt.Fatalf("%s: submission %s has %d settlements", k, id, settled[id])
			}
		}
	}
	for k := range m.gone {
		inst, sess, _ := cut(k)
		p, recs := r.fresh(inst, sess)
		if p.Incarnation != "" || len(recs) != 0 {
			rt.Fatalf("%s deleted, yet reads %+v", k, p)
		}
	}
}

func cut(k string) (string, string, bool) {
	for i := range k {
		if k[i] == '/' {
			return k[:i], k[i+1:], true
		}
	}
	return k, "", false
}
