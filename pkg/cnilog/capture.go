package cnilog

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
)

// maxCapture bounds how much of the result a log line looks at.
const maxCapture = 64 << 10

// capture tees what the verb prints on stdout (the CNI result) so the ADD
// line can name the addresses handed out. The result still reaches the real
// stdout byte for byte.
type capture struct {
	real *os.File
	w    *os.File
	done chan struct{}
	buf  bytes.Buffer
}

func startCapture() *capture {
	r, w, err := os.Pipe()
	if err != nil {
		return nil // no addresses in the log line; the verb is unaffected
	}
	c := &capture{real: os.Stdout, w: w, done: make(chan struct{})}
	os.Stdout = w
	go func() {
		defer close(c.done)
		defer r.Close()
		_, _ = io.Copy(io.MultiWriter(c.real, &limited{&c.buf}), r)
	}()
	return c
}

func (c *capture) stop() {
	if c == nil {
		return
	}
	os.Stdout = c.real
	_ = c.w.Close()
	<-c.done
}

// ips pulls the addresses out of a result of any CNI version.
func (c *capture) ips() []string {
	if c == nil || c.buf.Len() == 0 {
		return nil
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
		IP4 *struct {
			IP string `json:"ip"`
		} `json:"ip4"`
		IP6 *struct {
			IP string `json:"ip"`
		} `json:"ip6"`
	}
	if json.Unmarshal(c.buf.Bytes(), &res) != nil {
		return nil
	}
	var out []string
	for _, ip := range res.IPs {
		out = append(out, ip.Address)
	}
	if res.IP4 != nil && res.IP4.IP != "" {
		out = append(out, res.IP4.IP)
	}
	if res.IP6 != nil && res.IP6.IP != "" {
		out = append(out, res.IP6.IP)
	}
	return out
}

// limited keeps the first maxCapture bytes and swallows the rest, never
// failing the copy to the real stdout.
type limited struct{ b *bytes.Buffer }

func (l *limited) Write(p []byte) (int, error) {
	if room := maxCapture - l.b.Len(); room > 0 {
		if len(p) < room {
			room = len(p)
		}
		l.b.Write(p[:room])
	}
	return len(p), nil
}
