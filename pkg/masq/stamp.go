package masq

import "strings"

// The bridge's ifalias carries the stamps of the networks on it:
// "village:" + comma-separated items, one per network, each
// "m<4 hex: network><12 hex: spec>@<backend letter><fingerprint>".

const stampPrefix = "village:"

// FindStamp returns the alias item of the network whose stamps start with
// netKey (StampNetwork of its spec's Stamp), "" if none.
func FindStamp(alias, netKey string) string {
	if !strings.HasPrefix(alias, stampPrefix) {
		return ""
	}
	for _, s := range strings.Split(strings.TrimPrefix(alias, stampPrefix), ",") {
		if strings.HasPrefix(s, netKey) {
			return s
		}
	}
	return ""
}

// SetStamp replaces the network's item (same network key) with stamp,
// keeping other networks' items while they fit in an ifalias.
func SetStamp(alias, stamp string) string {
	key := StampNetwork(stamp)
	items := []string{stamp}
	if strings.HasPrefix(alias, stampPrefix) {
		for _, s := range strings.Split(strings.TrimPrefix(alias, stampPrefix), ",") {
			if s != "" && !strings.HasPrefix(s, key) {
				items = append(items, s)
			}
		}
	}
	out := stampPrefix + strings.Join(items, ",")
	for len(out) > 250 && len(items) > 1 {
		items = items[:len(items)-1]
		out = stampPrefix + strings.Join(items, ",")
	}
	return out
}

var backendLetters = map[string]byte{IPTables: 'i', NFTables: 'n'}

// StampBackend is the backend a stamp was made with ("" if it does not say).
func StampBackend(stamp string) string {
	at := strings.IndexByte(stamp, '@')
	if at < 0 || at+1 >= len(stamp) {
		return ""
	}
	for name, l := range backendLetters {
		if stamp[at+1] == l {
			return name
		}
	}
	return ""
}
