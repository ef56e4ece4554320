//go:build unix && !linux && !darwin

package aip

// mountReadOnly: read-only mounts are not detected on this platform, so
// a writable directory is refused even there.
func mountReadOnly(string) bool { return false }
