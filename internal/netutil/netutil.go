// Package netutil holds small network helpers shared by the fleet's servers
// and clients.
package netutil

import (
	"net/http"
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

// forwardingHeaders are the request headers by which a proxy says that it
// forwards a request for someone else (and that Envoy, which an Istio
// sidecar runs, sets on the requests it passes on).
var forwardingHeaders = []string{
	"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "Via",
	"X-Forwarded-Client-Cert", "X-Envoy-External-Address", "X-Envoy-Expected-Rq-Timeout-Ms",
}

// IsLocalUnproxied reports whether r was made on this machine and not
// passed on by a proxy on it: its peer is loopback (IsLoopbackPeer) and it
// carries none of the headers a proxy adds to say it forwards a request
// (Forwarded, X-Forwarded-*, X-Real-IP, Via, Envoy's). Behind a proxy on
// the same machine every caller is a loopback peer; one that adds none of
// those headers cannot be told from a local caller, which is why the
// servers that show readiness detail to local peers can be told to show it
// to none.
func IsLocalUnproxied(r *http.Request) bool {
	if !IsLoopbackPeer(r.RemoteAddr) {
		return false
	}
	for _, h := range forwardingHeaders {
		if len(r.Header.Values(h)) > 0 {
			return false
		}
	}
	return true
}
