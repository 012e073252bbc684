package main

import (
	"net/netip"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

func ask(t testing.TB, id uint16, name string, typ dnsmessage.Type, response bool) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, Response: response})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestAnswer: the responder answers an A or ANY question for its own name
// (any case) with its address and the asker's ID, and nothing else.
func TestAnswer(t *testing.T) {
	name, err := fqdn("Village-Demo.local")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("192.168.50.200")
	for _, tc := range []struct {
		what     string
		msg      []byte
		answered bool
	}{
		{"A for the name", ask(t, 7, "village-demo.local.", dnsmessage.TypeA, false), true},
		{"A in another case", ask(t, 7, "VILLAGE-demo.LOCAL.", dnsmessage.TypeA, false), true},
		{"ANY", ask(t, 7, "village-demo.local.", dnsmessage.TypeALL, false), true},
		{"AAAA", ask(t, 7, "village-demo.local.", dnsmessage.TypeAAAA, false), false},
		{"another name", ask(t, 7, "printer.local.", dnsmessage.TypeA, false), false},
		{"a response, not a question", ask(t, 7, "village-demo.local.", dnsmessage.TypeA, true), false},
		{"garbage", []byte{1, 2, 3}, false},
	} {
		reply, ok := answer(tc.msg, name, addr)
		if ok != tc.answered {
			t.Errorf("%s: answered %v, want %v", tc.what, ok, tc.answered)
			continue
		}
		if !ok {
			continue
		}
		got, ok := parseAnswer(reply, 7, name)
		if !ok || got != addr {
			t.Errorf("%s: the asker reads %v %v, want %s", tc.what, got, ok, addr)
		}
		if _, ok := parseAnswer(reply, 8, name); ok {
			t.Errorf("%s: an answer to query 7 was taken for query 8", tc.what)
		}
	}
	if _, err := fqdn("village-demo.example.com"); err == nil {
		t.Error("a name outside .local was accepted")
	}
}

// FuzzAnswer: no message makes the responder or the asker panic, and an
// answer, when given, reads back as the responder's address.
func FuzzAnswer(f *testing.F) {
	f.Add(ask(f, 1, "village-demo.local.", dnsmessage.TypeA, false))
	f.Add([]byte{0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	name := dnsmessage.MustNewName("village-demo.local.")
	addr := netip.MustParseAddr("192.168.50.200")
	f.Fuzz(func(t *testing.T, msg []byte) {
		_, _ = parseAnswer(msg, 1, name)
		reply, ok := answer(msg, name, addr)
		if !ok {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(msg)
		if err != nil {
			t.Fatalf("answered an unparsable message: %v", err)
		}
		if got, ok := parseAnswer(reply, h.ID, name); !ok || got != addr {
			t.Fatalf("answer reads %v %v", got, ok)
		}
	})
}
