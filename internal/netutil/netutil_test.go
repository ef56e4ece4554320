package netutil

import "testing"

func TestIsLoopbackHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"localhost", true},
		{"LocalHost", true},
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"::1", true},
		{"[::1]", true},
		{"::ffff:127.0.0.1", true},
		{"", false},
		{"localhost.", false},
		{"localhost.example.com", false},
		{"sub.localhost", false},
		{"0.0.0.0", false},
		{"::", false},
		{"128.0.0.1", false},
		{"10.0.0.1", false},
		{"192.168.1.1", false},
		{"::2", false},
		{"example.com", false},
		{"127.0.0.1:80", false},
		{"[::1]:80", false},
		{"fe80::1%lo", false},
	} {
		if got := IsLoopbackHost(tc.host); got != tc.want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}

func TestIsLoopbackPeer(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:5000":        true,
		"127.8.9.1:1":           true,
		"[::1]:443":             true,
		"[::ffff:127.0.0.1]:80": true,
		"10.0.0.5:5000":         false,
		"[fe80::1]:80":          false,
		"127.0.0.1":             false, // not ip:port
		"localhost:80":          false, // a name, never resolved
		"":                      false,
	} {
		if got := IsLoopbackPeer(addr); got != want {
			t.Errorf("IsLoopbackPeer(%q) = %v, want %v", addr, got, want)
		}
	}
}
