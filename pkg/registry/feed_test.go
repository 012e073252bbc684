package registry

import (
	"fmt"
	"slices"
	"testing"
)

func feedNode(name, ip string) Node {
	return Node{Name: name, IP: ip, PodCIDRs: []string{"10.1.0.0/24"}}
}

func take(t *testing.T, f *Feed) Batch {
	t.Helper()
	select {
	case <-f.Ready():
	default:
		t.Fatal("Ready has no value")
	}
	b, ok := f.Take()
	if !ok {
		t.Fatal("Ready had a value but Take found nothing")
	}
	return b
}

func batchNames(b Batch) (put, removed []string) {
	for _, n := range b.Nodes {
		put = append(put, n.Name+"="+n.IP)
	}
	return put, b.Removed
}

// The first list, put one record at a time, reaches the reader as one full
// batch once the feed is opened; after that only changes come, coalesced
// by name while the reader does not take them.
func TestFeedFirstFullThenChangesCoalesced(t *testing.T) {
	f := NewFeed()
	f.Put(feedNode("b", "192.168.0.2"), 1)
	f.Put(feedNode("a", "192.168.0.1"), 2)
	f.Put(feedNode("gone", "192.168.0.9"), 3)
	f.Remove("gone", 4)
	select {
	case <-f.Ready():
		t.Fatal("Ready before Open")
	default:
	}
	if _, ok := f.Take(); ok {
		t.Fatal("Take before Open gave a batch")
	}
	f.Open()
	b := take(t, f)
	put, removed := batchNames(b)
	if !b.Full || !slices.Equal(put, []string{"a=192.168.0.1", "b=192.168.0.2"}) || removed != nil || b.Revision != 4 {
		t.Fatalf("first batch %+v, want full a,b at revision 4", b)
	}
	if _, ok := f.Take(); ok {
		t.Fatal("a second Take with nothing pending gave a batch")
	}

	f.Put(feedNode("a", "192.168.0.11"), 5)
	f.Put(feedNode("a", "192.168.0.21"), 6) // the last put of a name wins
	f.Remove("b", 7)
	f.Put(feedNode("c", "192.168.0.3"), 8)
	f.Remove("c", 9) // a put then a removal: the removal
	f.Remove("d", 10)
	f.Put(feedNode("d", "192.168.0.4"), 11) // a removal then a put: the put
	b = take(t, f)
	put, removed = batchNames(b)
	if b.Full || !slices.Equal(put, []string{"a=192.168.0.21", "d=192.168.0.4"}) || !slices.Equal(removed, []string{"b", "c"}) || b.Revision != 11 {
		t.Fatalf("change batch %+v", b)
	}

	view := map[string]Node{"a": feedNode("a", "192.168.0.1"), "b": feedNode("b", "192.168.0.2")}
	b.ApplyTo(view)
	if len(view) != 2 || view["a"].IP != "192.168.0.21" || view["d"].IP != "192.168.0.4" {
		t.Fatalf("view after the batch: %+v", view)
	}
}

// A Reset drops the changes pending before it: the next batch is the whole
// list, with what was put after the Reset.
func TestFeedResetReplacesPending(t *testing.T) {
	f := NewFeed()
	f.Open()
	take(t, f) // the first, empty, full batch
	f.Put(feedNode("stale", "192.168.0.9"), 1)
	f.Remove("x", 2)
	var list []Node
	for i := range 3 {
		list = append(list, feedNode(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.1.%d", i)))
	}
	f.Reset(list, 3)
	list[0].PodCIDRs[0] = "10.9.9.0/24" // the feed keeps its own copy
	f.Remove("n1", 4)
	f.Put(feedNode("n3", "192.168.1.3"), 5)
	b := take(t, f)
	put, removed := batchNames(b)
	if !b.Full || !slices.Equal(put, []string{"n0=192.168.1.0", "n2=192.168.1.2", "n3=192.168.1.3"}) || removed != nil {
		t.Fatalf("batch after Reset %+v", b)
	}
	if b.Nodes[0].PodCIDRs[0] != "10.1.0.0/24" {
		t.Fatalf("the feed's copy changed with the caller's: %v", b.Nodes[0].PodCIDRs)
	}
	view := map[string]Node{"stale": feedNode("stale", "192.168.0.9")}
	b.ApplyTo(view)
	if _, ok := view["stale"]; ok || len(view) != 3 {
		t.Fatalf("a full batch left %+v", view)
	}
}
