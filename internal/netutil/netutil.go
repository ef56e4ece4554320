// Package netutil holds small network helpers shared by the fleet's servers
// and clients.
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

// IsLoopbackPeer reports whether an HTTP request's RemoteAddr ("ip:port")
// is a loopback address: the request was made on this machine (or through
// a proxy on it). Servers show the detail of their failing readiness
// checks only to such peers.
func IsLoopbackPeer(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
