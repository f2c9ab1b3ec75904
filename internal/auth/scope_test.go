package auth

import (
	"errors"
	"testing"
)

func TestParseScope(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Scope
		bad  bool
	}{
		{in: "admin", want: Scope{Verb: VerbAdmin}},
		{in: "read:*/*", want: Scope{VerbRead, "*", "*"}},
		{in: "deliver:support/customer-42", want: Scope{VerbDeliver, "support", "customer-42"}},
		{in: "read:support/{sub}", want: Scope{VerbRead, "support", SubjectPattern}},
		{in: "manage:support/team-*", want: Scope{VerbManage, "support", "team-*"}},
		{in: "abort:*/x", want: Scope{VerbAbort, "*", "x"}},
		{in: "", bad: true},
		{in: "read", bad: true},
		{in: "write:a/b", bad: true},
		{in: "admin:a/b", bad: true},
		{in: "read:a", bad: true},
		{in: "read:/b", bad: true},
		{in: "read:a/", bad: true},
		{in: "read:a/b/c", bad: true},
		{in: "read:{sub}/b", bad: true},
		{in: "read:a/b*c", bad: true},
		{in: "read:a/*b*", bad: true},
		{in: "read:a/{subject}", bad: true},
		{in: "read:a b/c", bad: true},
	} {
		got, err := ParseScope(tc.in)
		if tc.bad {
			if !errors.Is(err, ErrInvalidScope) {
				t.Errorf("ParseScope(%q) = %v, %v; want ErrInvalidScope", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseScope(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if back, err := ParseScope(got.String()); err != nil || back != got {
			t.Errorf("ParseScope(%q.String()) = %+v, %v", tc.in, back, err)
		}
	}
}

func TestAllows(t *testing.T) {
	p := func(sub string, scopes ...string) Principal {
		sc, err := ParseScopes(scopes)
		if err != nil {
			t.Fatal(err)
		}
		return Principal{Subject: sub, Scopes: sc}
	}
	for _, tc := range []struct {
		name     string
		p        Principal
		verb     Verb
		agent    string
		instance string
		want     bool
	}{
		{"wildcards", p("ops", "read:*/*"), VerbRead, "support", "c1", true},
		{"verb differs", p("ops", "read:*/*"), VerbDeliver, "support", "c1", false},
		{"literal", p("u", "deliver:support/customer-42"), VerbDeliver, "support", "customer-42", true},
		{"other instance", p("u", "deliver:support/customer-42"), VerbDeliver, "support", "customer-43", false},
		{"other agent", p("u", "deliver:support/customer-42"), VerbDeliver, "sales", "customer-42", false},
		{"own subject", p("alice", "read:support/{sub}"), VerbRead, "support", "alice", true},
		{"other subject", p("alice", "read:support/{sub}"), VerbRead, "support", "bob", false},
		{"empty subject never matches {sub}", p("", "read:support/{sub}"), VerbRead, "support", "", false},
		{"prefix", p("t", "manage:support/team-*"), VerbManage, "support", "team-a", true},
		{"prefix miss", p("t", "manage:support/team-*"), VerbManage, "support", "teamb", false},
		{"admin", p("root", "admin"), VerbAdmin, "", "", true},
		{"admin is not read", p("root", "admin"), VerbRead, "support", "x", false},
		{"read is not admin", p("ops", "read:*/*"), VerbAdmin, "", "", false},
		{"no scopes", p("nobody"), VerbRead, "support", "x", false},
	} {
		if got := tc.p.Allows(tc.verb, tc.agent, tc.instance); got != tc.want {
			t.Errorf("%s: Allows(%s, %s/%s) = %v, want %v", tc.name, tc.verb, tc.agent, tc.instance, got, tc.want)
		}
	}
}

func FuzzParseScope(f *testing.F) {
	for _, s := range []string{"admin", "read:*/*", "deliver:support/customer-42", "read:support/{sub}", "manage:a/b*", "read:a/b/c", ":/", "read:{sub}/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := ParseScope(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidScope) {
				t.Fatalf("ParseScope(%q): error %v is not ErrInvalidScope", s, err)
			}
			return
		}
		back, err := ParseScope(sc.String())
		if err != nil || back != sc {
			t.Fatalf("ParseScope(%q) = %+v does not round-trip: %+v, %v", s, sc, back, err)
		}
		// A parsed scope never grants another verb.
		for _, v := range []Verb{VerbRead, VerbDeliver, VerbAbort, VerbManage, VerbAdmin} {
			if v != sc.Verb && sc.allows(v, "a", "b", "b") {
				t.Fatalf("%q grants %s", s, v)
			}
		}
	})
}
