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
