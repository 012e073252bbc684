package plugin

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// parseResolvConf reads nameserver, domain, search and options lines of a
// resolv.conf-style file into the result's DNS section.
func parseResolvConf(path string) (*types.DNS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading DNS settings: %w", err)
	}
	defer f.Close()
	var dns types.DNS
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") || strings.HasPrefix(fields[0], ";") {
			continue
		}
		switch fields[0] {
		case "nameserver":
			dns.Nameservers = append(dns.Nameservers, fields[1])
		case "domain":
			dns.Domain = fields[1]
		case "search":
			dns.Search = append(dns.Search, fields[1:]...)
		case "options":
			dns.Options = append(dns.Options, fields[1:]...)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading DNS settings from %s: %w", path, err)
	}
	return &dns, nil
}
