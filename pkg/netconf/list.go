package netconf

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Entry is one plugin entry of type "village" of a network configuration,
// as a runtime hands it to the plugin.
type Entry struct {
	// Index is the entry's position in the list's "plugins"; -1 when the
	// configuration is a single plugin configuration (a .conf).
	Index int
	// Bytes is the entry with the list's "name" and "cniVersion" filled
	// in, as libcni does before it execs the plugin: what Parse reads.
	Bytes []byte
}

// ErrNoVillage says a network configuration holds no plugin of type
// "village".
var ErrNoVillage = errors.New(`no plugin of type "village"`)

// FromList returns the village entries of raw, a conflist or a single
// plugin configuration, in list order. It is the one walk of a conflist:
// villaged's (the first entry is its network) and `villaged install`'s
// (every entry is checked) alike.
//
// A list's entries are decoded and encoded again with the list's name and
// cniVersion (as written: "cniVersions" is a runtime's choice, and Parse
// reads the version only for a prevResult, which a conflist never holds)
// put in, the way libcni builds the plugin's stdin; a single configuration
// is returned as it is. The error wraps ErrNoVillage when there is no
// village entry.
func FromList(raw []byte) ([]Entry, error) {
	var list struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if list.Plugins == nil {
		var one struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(raw, &one)
		if one.Type != "village" {
			return nil, &noVillageError{fmt.Sprintf("plugin type is %q, not village", one.Type)}
		}
		return []Entry{{Index: -1, Bytes: raw}}, nil
	}
	var out []Entry
	for i, p := range list.Plugins {
		// the type as libcni reads it (a struct: the key matches in any case)
		var typ struct {
			Type any `json:"type"`
		}
		if err := json.Unmarshal(p, &typ); err != nil {
			return nil, fmt.Errorf("plugins[%d]: %w", i, err)
		}
		if typ.Type != "village" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(p, &m); err != nil {
			return nil, fmt.Errorf("plugins[%d]: %w", i, err)
		}
		m["name"], m["cniVersion"] = list.Name, list.CNIVersion
		b, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("plugins[%d]: %w", i, err)
		}
		out = append(out, Entry{Index: i, Bytes: b})
	}
	if len(out) == 0 {
		return nil, &noVillageError{`no plugin of type "village" in the list`}
	}
	return out, nil
}

// noVillageError is ErrNoVillage with what was found instead.
type noVillageError struct{ msg string }

func (e *noVillageError) Error() string        { return e.msg }
func (e *noVillageError) Is(target error) bool { return target == ErrNoVillage }
