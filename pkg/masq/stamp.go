package masq

import (
	"fmt"
	"strconv"
	"strings"
)

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

// digest is the part of a stamp before the fingerprint: the spec's Stamp
// and the backend's letter.
func digest(s Spec, backend string) string {
	return s.Stamp() + "@" + string(backendLetters[backend])
}

// covers reports whether stamp, recorded by a look at the rules of the
// spec and backend of digest, makes a look by a caller that read the
// fingerprint seen unnecessary: the same fingerprint (nothing changed
// since the rules were found complete), or an nf_tables generation past
// seen's. Generations only grow, so a look whose fingerprint was read at a
// later generation began after seen was read, and saw (and repaired)
// whatever had changed by then: the look of another ADD that held the lock
// while this one waited for it.
func covers(stamp, digest, seen string) bool {
	had, ok := strings.CutPrefix(stamp, digest)
	if !ok {
		return false
	}
	if had == seen {
		return true
	}
	hg, ok1 := fingerprintGen(had)
	sg, ok2 := fingerprintGen(seen)
	return ok1 && ok2 && int32(hg-sg) > 0
}

// fingerprintGen is the nf_tables generation a fingerprint starts with
// ("g<hex>", see Fingerprint); false for one without (legacy only, or a
// generation that could not be read).
func fingerprintGen(fp string) (uint32, bool) {
	rest, ok := strings.CutPrefix(fp, "g")
	if !ok {
		return 0, false
	}
	if i := strings.IndexByte(rest, 'l'); i >= 0 {
		rest = rest[:i]
	}
	g, err := strconv.ParseUint(rest, 16, 32)
	return uint32(g), err == nil
}

// advanceStamps moves every stamp in alias whose fingerprint is at
// generation from to generation to, keeping the rest of each fingerprint:
// the caller made the one nf_tables transaction between them, and it
// touched nothing a stamp vouches for (a pod's macspoofchk rule).
func advanceStamps(alias string, from, to uint32) string {
	if !strings.HasPrefix(alias, stampPrefix) {
		return alias
	}
	items := strings.Split(strings.TrimPrefix(alias, stampPrefix), ",")
	for i, s := range items {
		at := strings.IndexByte(s, '@')
		if at < 0 || at+2 > len(s) {
			continue
		}
		fp := s[at+2:]
		if g, ok := fingerprintGen(fp); ok && g == from {
			tail := ""
			if l := strings.IndexByte(fp, 'l'); l >= 0 {
				tail = fp[l:]
			}
			items[i] = s[:at+2] + fmt.Sprintf("g%x", to) + tail
		}
	}
	return stampPrefix + strings.Join(items, ",")
}
