package controlplane_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestManifestDigestRefusalSaysWhatToDo: a registration whose manifest is
// not the admitted version's is refused with what to do about it — print
// the running connector's manifest with --print-manifest, compare it with
// the version's manifest_digest, and, a version's manifest never
// changing, admit it as a new version ID — not only that it differs. The
// message still starts with the field, which hosts read.
func TestManifestDigestRefusalSaysWhatToDo(t *testing.T) {
	e := newEnv(t, newMemBackend)
	h := e.provision("a1")
	r, _ := h.send(h.registration(func(r *aip.Registration) { r.ManifestDigest = registrytest.Digest("another manifest") }))
	r.rejected(t, http.StatusForbidden, "digest: manifest_digest ")
	msg := r.outcome.Message
	for _, want := range []string{
		"--print-manifest",
		"manifest_digest " + e.w.Version.ManifestDigest + " in the fleet file",
		"a version's manifest never changes",
		"a new version ID in the fleet file",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal does not say %q: %s", want, msg)
		}
	}
}
