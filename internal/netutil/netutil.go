// Package netutil holds small network helpers shared by the host SDK and the
// sidecar.
package netutil

import (
	"net/netip"
	"strings"
)

// IsLoopbackHost reports whether host names the local machine: "localhost"
// in any letter case, or a loopback IP address (127.0.0.0/8, ::1, including
// IPv4-mapped forms), optionally in square brackets as in a URL's host. It
// does no DNS lookup; other names are not loopback.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}
