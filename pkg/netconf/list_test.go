package netconf_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/village-cni/village/pkg/netconf"
)

// TestFromList: the village entries of a conflist come back in list order
// with their index and the list's name and cniVersion put in (a value the
// entry itself had is replaced, as libcni does); a single plugin
// configuration comes back as it is; no village entry is ErrNoVillage.
func TestFromList(t *testing.T) {
	type got struct {
		Index            int
		Name, CNIVersion string
		Bridge           string
	}
	for _, tc := range []struct {
		name, in string
		want     []got
		err      error
	}{
		{"one entry", `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"village","bridge":"b0"}]}`,
			[]got{{0, "n", "1.0.0", "b0"}}, nil},
		{"after others", `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"loopback"},{"type":"village","bridge":"b1"},{"type":"portmap"}]}`,
			[]got{{1, "n", "1.0.0", "b1"}}, nil},
		{"two entries", `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"village","bridge":"a"},{"type":"village","bridge":"b"}]}`,
			[]got{{0, "n", "1.0.0", "a"}, {1, "n", "1.0.0", "b"}}, nil},
		{"entry's own name replaced", `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"village","name":"x","cniVersion":"0.4.0"}]}`,
			[]got{{0, "n", "1.0.0", ""}}, nil},
		{"cniVersions left to the runtime", `{"name":"n","cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"plugins":[{"type":"village"}]}`,
			[]got{{0, "n", "1.0.0", ""}}, nil},
		{"single conf", `{"name":"s","cniVersion":"0.4.0","type":"village","bridge":"c"}`,
			[]got{{-1, "s", "0.4.0", "c"}}, nil},
		{"single conf of another type", `{"name":"s","type":"bridge"}`, nil, netconf.ErrNoVillage},
		{"no village entry", `{"name":"n","plugins":[{"type":"bridge"}]}`, nil, netconf.ErrNoVillage},
		{"empty list", `{"name":"n","plugins":[]}`, nil, netconf.ErrNoVillage},
		{"type not a string", `{"name":"n","plugins":[{"type":7}]}`, nil, netconf.ErrNoVillage},
		{"key in another case, as libcni reads it", `{"name":"n","plugins":[{"Type":"village"}]}`, []got{{0, "n", "", ""}}, nil},
		{"entry not an object", `{"name":"n","plugins":["village"]}`, nil, nil},
		{"not JSON", `{"name":`, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entries, err := netconf.FromList([]byte(tc.in))
			if tc.want == nil {
				if err == nil {
					t.Fatalf("FromList = %v, want an error", entries)
				}
				if tc.err != nil && !errors.Is(err, tc.err) {
					t.Fatalf("FromList error %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromList: %v", err)
			}
			if len(entries) != len(tc.want) {
				t.Fatalf("FromList = %d entries, want %d", len(entries), len(tc.want))
			}
			for i, e := range entries {
				var g got
				if err := json.Unmarshal(e.Bytes, &g); err != nil {
					t.Fatalf("entry %d %s: %v", i, e.Bytes, err)
				}
				g.Index = e.Index
				if g != tc.want[i] {
					t.Errorf("entry %d = %+v, want %+v", i, g, tc.want[i])
				}
			}
		})
	}
}

// TestFromListFeedsParse: an entry FromList returns is what Parse reads,
// name and all, including its networkPolicy key.
func TestFromListFeedsParse(t *testing.T) {
	entries, err := netconf.FromList([]byte(`{"name":"net","cniVersion":"1.1.0","plugins":[{"type":"village","networkPolicy":true,"mtu":1400.0}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, entries[0].Bytes, "")
	if c.Name != "net" || c.CNIVersion != "1.1.0" || !c.NetworkPolicy || c.MTU != 1400 {
		t.Fatalf("parsed %+v", c)
	}
}

// FuzzFromList: FromList never panics, and every entry it returns is a
// JSON object of type village with the list's name.
func FuzzFromList(f *testing.F) {
	f.Add([]byte(`{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"loopback"},{"type":"village","bridge":"b1"}]}`))
	f.Add([]byte(`{"name":"s","type":"village"}`))
	f.Add([]byte(`{"name":"n","plugins":[null,{"type":"village","name":5}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		entries, err := netconf.FromList(raw)
		if err != nil {
			return
		}
		var list struct {
			Name    string            `json:"name"`
			Plugins []json.RawMessage `json:"plugins"`
		}
		_ = json.Unmarshal(raw, &list)
		for _, e := range entries {
			// the type as a runtime reads it (any case of the key), the
			// name as FromList wrote it
			var typ struct {
				Type any `json:"type"`
			}
			var m map[string]any
			if err := errors.Join(json.Unmarshal(e.Bytes, &typ), json.Unmarshal(e.Bytes, &m)); err != nil {
				t.Fatalf("entry %s is not an object: %v", e.Bytes, err)
			}
			if typ.Type != "village" {
				t.Fatalf("entry %s is of type %v", e.Bytes, typ.Type)
			}
			if e.Index >= 0 && m["name"] != list.Name {
				t.Fatalf("entry %s has name %v, the list %q", e.Bytes, m["name"], list.Name)
			}
		}
	})
}
