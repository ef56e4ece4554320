package aip

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// inMountNamespace runs f on a thread of its own in a new private mount
// namespace, so the mounts f makes are seen by nothing else and vanish
// with the thread. It skips the test when the process may not (not root,
// or no CAP_SYS_ADMIN, as in most containers that are not privileged).
// f runs on another goroutine than the test's: it reports with t.Error
// and returns (the helpers' t.Fatal only for what cannot happen).
func inMountNamespace(t *testing.T, f func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, with its namespace, ends with
		// the goroutine.
		runtime.LockOSThread()
		if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
			errc <- err
			return
		}
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
			errc <- err
			return
		}
		defer func() { errc <- nil }()
		f()
	}()
	if err := <-errc; err != nil {
		t.Skipf("cannot make a mount namespace: %v", err)
	}
}

// kubeletVolume lays dir out as the kubelet's atomic writer does: the
// files in a timestamped directory (0755, 2755 with an fsGroup), a
// ..data link to it, and a link per key through ..data, all root's.
func kubeletVolume(t *testing.T, dir string, fsGroup int, files map[string]os.FileMode) {
	t.Helper()
	stamp := filepath.Join(dir, "..2026_12_01_08_00_00.123456789")
	mode := os.FileMode(0o755)
	if fsGroup != 0 {
		mode |= os.ModeSetgid
	}
	mkdirOwned(t, stamp, mode, 0)
	for name, fm := range files {
		content := zeroSeedHex
		if strings.HasSuffix(name, ".did") {
			content = "did:key:z6Mkexample"
		}
		putFile(t, stamp, name, content, fm)
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(stamp), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if fsGroup != 0 {
		for _, p := range []string{dir, stamp} {
			if err := os.Lchown(p, 0, fsGroup); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestKubernetesVolumesOnReadOnlyMounts: what the kubelet creates. A
// secret (and projected, downwardAPI) volume is a tmpfs, whose root is
// 1777 (3777 with an fsGroup): root's and sticky, accepted. A ConfigMap
// volume is a directory on the node's disk made 0777 (2777 with an
// fsGroup), without the sticky bit; the kubelet mounts both into the
// container read-only, and a root-owned directory on a read-only mount
// is accepted whatever its mode: nobody can rename an entry in it. The
// same 0777 directory mounted read-write is refused.
func TestKubernetesVolumesOnReadOnlyMounts(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	for _, fsGroup := range []int{0, 2000} {
		secret := mkdirOwned(t, filepath.Join(base, fmt.Sprint("secret-", fsGroup)), 0o755, 0)
		config := mkdirOwned(t, filepath.Join(base, fmt.Sprint("config-", fsGroup)), 0o777, 0)
		inMountNamespace(t, func() {
			// the kubelet's tmpfs: no mode option, so 1777
			if err := syscall.Mount("tmpfs", secret, "tmpfs", 0, ""); err != nil {
				t.Errorf("mount tmpfs: %v", err)
				return
			}
			if fsGroup != 0 {
				if err := os.Chmod(config, 0o777|os.ModeSetgid); err != nil {
					t.Error(err)
					return
				}
				if err := os.Chmod(secret, 0o777|os.ModeSticky|os.ModeSetgid); err != nil {
					t.Error(err)
					return
				}
			}
			kubeletVolume(t, secret, fsGroup, map[string]os.FileMode{"signing-seed": 0o400})
			kubeletVolume(t, config, fsGroup, map[string]os.FileMode{"gateway.did": 0o644})

			seed := filepath.Join(secret, "signing-seed")
			did := filepath.Join(config, "gateway.did")
			if err := readSecret(seed); err != nil {
				t.Errorf("fsGroup %d: a secret volume (tmpfs, 1777): %v", fsGroup, err)
			}
			wantDirRefused(t, "a ConfigMap volume's 0777 directory mounted read-write", readTrust(did), did, config, "chmod go-w "+config)

			// the container's view: both bind-mounted read-only
			for _, dir := range []string{secret, config} {
				if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
					t.Errorf("bind %s: %v", dir, err)
					return
				}
				if err := syscall.Mount("", dir, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
					t.Errorf("remount %s read-only: %v", dir, err)
					return
				}
			}
			if err := os.WriteFile(filepath.Join(config, "x"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
				t.Errorf("the ConfigMap volume is not read-only: %v", err)
				return
			}
			if err := readSecret(seed); err != nil {
				t.Errorf("fsGroup %d: a secret volume mounted read-only: %v", fsGroup, err)
			}
			if err := readTrust(did); err != nil {
				t.Errorf("fsGroup %d: a ConfigMap volume (0777) mounted read-only: %v", fsGroup, err)
			}
		})
	}
}
