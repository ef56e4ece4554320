package registry_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestMatchVersionRequirement(t *testing.T) {
	cases := []struct {
		req, version string
		want         bool
	}{
		{"^1.0", "1.0.0", true}, {"^1.0", "1.9.3", true}, {"^1.0", "2.0.0", false}, {"^1.2", "1.1.9", false},
		{"1.0", "1.4.0", true}, {"1", "1.99.0", true}, {"1", "2.0.0", false},
		{"^0.2.3", "0.2.9", true}, {"^0.2.3", "0.3.0", false}, {"^0.0.3", "0.0.3", true}, {"^0.0.3", "0.0.4", false},
		{"~1.2.3", "1.2.9", true}, {"~1.2.3", "1.3.0", false}, {"~1", "1.9.0", true},
		{"=1.0", "1.0.5", true}, {"=1.0.0", "1.0.1", false},
		{">=1.0, <2", "1.5.0", true}, {">=1.0, <2", "2.0.0", false}, {">1.0", "1.0.9", false}, {">1.0", "1.1.0", true},
		{"<=1.0", "1.0.9", true}, {"<=1.0", "1.1.0", false}, {"*", "7.0.0", true}, {">=2", "1.0.0", false},
	}
	for _, c := range cases {
		got, err := registry.MatchVersionRequirement(c.req, c.version)
		if err != nil || got != c.want {
			t.Errorf("MatchVersionRequirement(%q, %q) = %v, %v; want %v", c.req, c.version, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "one", "^1.x", "1.0.0.0", ">=1.0-beta", ",", "^"} {
		if _, err := registry.MatchVersionRequirement(bad, "1.0.0"); err == nil {
			t.Errorf("MatchVersionRequirement(%q) accepted a malformed requirement", bad)
		}
	}
}

func TestCheckVersionTransition(t *testing.T) {
	all := []registry.VersionStatus{registry.VersionCandidate, registry.VersionAdmitted, registry.VersionActive, registry.VersionRevoked}
	for _, from := range all {
		for _, to := range all {
			err := registry.CheckVersionTransition("cver_x", from, to)
			allowed := from == to || (from != registry.VersionRevoked && to != registry.VersionCandidate)
			if allowed != (err == nil) {
				t.Errorf("%s -> %s: %v, want allowed=%v", from, to, err, allowed)
			}
			if err != nil && !errors.Is(err, registry.ErrConflict) {
				t.Errorf("%s -> %s: %v is not ErrConflict", from, to, err)
			}
		}
	}
	if err := registry.CheckVersionTransition("cver_x", registry.VersionActive, "retired"); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("unknown status: %v", err)
	}
}

func sampleAssignment() registry.RouteAssignment {
	return registry.RouteAssignment{
		ActionID: "act_1", CapabilityID: "c", TenantID: "t", InstanceID: "cinst_i", VersionID: "cver_v", ManifestDigest: "sha256:m",
		ReplicaID: "crepl_r", Endpoint: "https://r.test", PeerPrincipalID: "service:r", PeerPrincipalKind: aip.PrincipalService,
		PeerDID: "did:key:z", TrustDomain: "d", TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		CatalogRevision: 3, BindingPolicyRevision: 4, CredentialRevisionRef: "cred", QuotaPolicyRef: "quota",
		ReplicaHealthRevision: 5, FenceToken: "route_1",
		Admission: registry.AdmissionReservation{
			PolicyRef: "quota", PolicyRevision: 1,
			BaseScopes:              []registry.AdmissionScope{{Kind: registry.ScopeTenant, Key: "t", Limit: 9}},
			RetryScope:              &registry.AdmissionScope{Kind: registry.ScopeTenantRetry, Key: "t", Limit: 2},
			CircuitFailureThreshold: 5, CircuitOpenMS: 1000,
		},
		AssignedAt: registrytest.Epoch,
	}
}

// TestRouteAssignmentEqualCoversEveryField changes each field (and each
// member of nested structs) in turn; Equal must notice every change, so a
// field added later cannot escape settlement's exact comparison — every
// field but HandOut, which says which hand-out of the same route a copy is
// (TestHandOutIsBookkeeping).
func TestRouteAssignmentEqualCoversEveryField(t *testing.T) {
	base := sampleAssignment()
	var visit func(v reflect.Value, path string)
	count := 0
	visit = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f, name := v.Field(i), path+v.Type().Field(i).Name
			if name == "HandOut" {
				continue
			}
			switch f.Kind() {
			case reflect.String:
				old := f.String()
				f.SetString(old + "x")
				check(t, &base, name)
				f.SetString(old)
			case reflect.Uint32, reflect.Uint64:
				old := f.Uint()
				f.SetUint(old + 1)
				check(t, &base, name)
				f.SetUint(old)
			case reflect.Slice:
				for j := range f.Len() {
					visit(f.Index(j), name+"[]. ")
				}
				old := reflect.ValueOf(f.Interface())
				f.Set(reflect.Zero(f.Type()))
				check(t, &base, name)
				f.Set(old)
			case reflect.Pointer:
				visit(f.Elem(), name+".")
				old := reflect.ValueOf(f.Interface())
				f.Set(reflect.Zero(f.Type()))
				check(t, &base, name)
				f.Set(old)
			case reflect.Struct:
				if f.Type() == reflect.TypeFor[time.Time]() {
					old := f.Interface().(time.Time)
					f.Set(reflect.ValueOf(old.Add(time.Millisecond)))
					check(t, &base, name)
					f.Set(reflect.ValueOf(old))
					continue
				}
				visit(f, name+".")
			default:
				t.Fatalf("field %s has kind %s the test does not vary", name, f.Kind())
			}
			count++
		}
	}
	visit(reflect.ValueOf(&base).Elem(), "")
	if count < 25 {
		t.Fatalf("varied only %d fields", count)
	}
	clone := base.Clone()
	if !clone.Equal(&base) {
		t.Fatal("a clone is not equal")
	}
	clone.Admission.BaseScopes[0].Limit++
	if base.Admission.BaseScopes[0].Limit != 9 {
		t.Fatal("Clone shares the scopes")
	}
	// Equal compares instants, not representations.
	other := base.Clone()
	other.AssignedAt = base.AssignedAt.In(time.FixedZone("x", 3600))
	if !other.Equal(&base) {
		t.Fatal("the same instant in another zone is not equal")
	}
}

func check(t *testing.T, changed *registry.RouteAssignment, field string) {
	t.Helper()
	base := sampleAssignment()
	if changed.Equal(&base) || base.Equal(changed) {
		t.Errorf("Equal ignores a change of %s", field)
	}
}

func TestRoute(t *testing.T) {
	a := sampleAssignment()
	r := a.Route(nil)
	if r.OriginalMode != nil || *r.CredentialRevisionRef != "cred" || *r.QuotaPolicyRef != "quota" || r.FenceToken != "route_1" ||
		r.ReplicaHealthRevision != 5 || r.CatalogRevision != 3 || r.BindingPolicyRevision != 4 || r.ManifestDigest != "sha256:m" {
		t.Fatalf("route %+v", r)
	}
	a.CredentialRevisionRef, a.QuotaPolicyRef = "", ""
	mode := aip.ModeAsync
	r = a.Route(&mode)
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"credential_revision_ref":null`) || !strings.Contains(string(b), `"original_mode":"async"`) {
		t.Fatalf("route JSON %s", b)
	}
}

func TestCursor(t *testing.T) {
	c := registry.Cursor(42, "cap:with:colons")
	rev, last, err := registry.ParseCursor(c)
	if err != nil || rev != 42 || last != "cap:with:colons" {
		t.Fatalf("ParseCursor(%q) = %d %q %v", c, rev, last, err)
	}
	if _, err := registry.CheckCursor(c, 43); !errors.Is(err, registry.ErrStaleCursor) {
		t.Fatalf("CheckCursor at another revision: %v", err)
	}
	if after, err := registry.CheckCursor("", 43); after != "" || err != nil {
		t.Fatal("an empty cursor starts at the beginning")
	}
	for _, bad := range []string{"", "42", ":x", "x:y", "-1:y", "42:", "18446744073709551616:x"} {
		if _, _, err := registry.ParseCursor(bad); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("ParseCursor(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestCompareCandidates(t *testing.T) {
	topo := func(region, zone string) aip.Topology {
		return aip.Topology{Region: region, Zone: zone, CapacityClass: "standard"}
	}
	pref := &registry.RouteTopologyPreference{Region: "eu", Zone: "eu-1"}
	cases := []struct {
		name string
		a, b registry.RouteCandidate // a must order first
	}{
		{"priority beats everything", registry.RouteCandidate{Priority: 0, ReplicaID: "crepl_z", Topology: topo("us", "us-1"), Active: 9},
			registry.RouteCandidate{Priority: 1, ReplicaID: "crepl_a", Topology: topo("eu", "eu-1")}},
		{"region beats zone and load", registry.RouteCandidate{ReplicaID: "crepl_z", Topology: topo("eu", "eu-2"), Active: 9},
			registry.RouteCandidate{ReplicaID: "crepl_a", Topology: topo("us", "eu-1")}},
		{"zone beats load", registry.RouteCandidate{ReplicaID: "crepl_z", Topology: topo("eu", "eu-1"), Active: 9},
			registry.RouteCandidate{ReplicaID: "crepl_a", Topology: topo("eu", "eu-2")}},
		{"load beats hash", registry.RouteCandidate{ReplicaID: "crepl_z", Topology: topo("eu", "eu-1"), Active: 1},
			registry.RouteCandidate{ReplicaID: "crepl_a", Topology: topo("eu", "eu-1"), Active: 2}},
		{"instance breaks a replica tie", registry.RouteCandidate{InstanceID: "cinst_a", ReplicaID: "crepl_x", Topology: topo("eu", "eu-1")},
			registry.RouteCandidate{InstanceID: "cinst_b", ReplicaID: "crepl_x", Topology: topo("eu", "eu-1")}},
	}
	for _, c := range cases {
		if registry.CompareCandidates(pref, "act_1", &c.a, &c.b) >= 0 || registry.CompareCandidates(pref, "act_1", &c.b, &c.a) <= 0 {
			t.Errorf("%s: order is wrong", c.name)
		}
	}
	// The hash decides between otherwise equal replicas, per action.
	x := registry.RouteCandidate{InstanceID: "cinst_a", ReplicaID: "crepl_x", Topology: topo("eu", "eu-1")}
	y := registry.RouteCandidate{InstanceID: "cinst_a", ReplicaID: "crepl_y", Topology: topo("eu", "eu-1")}
	wins := map[bool]int{}
	for i := range 64 {
		action := aip.NewActionID()
		c := registry.CompareCandidates(pref, action, &x, &y)
		if want := registry.RouteHash(action, "crepl_x") < registry.RouteHash(action, "crepl_y"); (c < 0) != want {
			t.Fatalf("action %d: compare %d disagrees with the hash order", i, c)
		}
		wins[c < 0]++
	}
	if wins[true] == 0 || wins[false] == 0 {
		t.Fatalf("the hash never varies with the action: %v", wins)
	}
	sum := sha256.Sum256([]byte("crepl_x" + "act_1"))
	want := uint64(0)
	for _, b := range sum[:8] {
		want = want<<8 | uint64(b)
	}
	if got := registry.RouteHash("act_1", "crepl_x"); got != want {
		t.Fatalf("RouteHash = %x, want the first 8 bytes of SHA-256(replica || action) %x", got, want)
	}
}

func TestReservations(t *testing.T) {
	b := registry.CapabilityBinding{TenantID: "t", CapabilityID: "c", InstanceID: "cinst_i"}
	key := registry.BindingScopeKey(b.Key())
	sum := sha256.Sum256([]byte("t\x1fc\x1fcinst_i"))
	if key != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("binding scope key %s", key)
	}
	cons := registry.ConservativePolicy("quota:c")
	r := registry.NewReservation(&cons, &b, "ctype_x", key)
	want := registry.AdmissionReservation{
		PolicyRef: "quota:c", PolicyRevision: 1, CircuitFailureThreshold: 5, CircuitOpenMS: 30000,
		BaseScopes: []registry.AdmissionScope{
			{Kind: registry.ScopeGlobal, Key: "fleet", Limit: 10000}, {Kind: registry.ScopeTenant, Key: "t", Limit: 1000},
			{Kind: registry.ScopeConnectorType, Key: "ctype_x", Limit: 2000}, {Kind: registry.ScopeInstance, Key: "cinst_i", Limit: 500},
			{Kind: registry.ScopeBinding, Key: key, Limit: 250},
		},
		RetryScope: &registry.AdmissionScope{Kind: registry.ScopeTenantRetry, Key: "t", Limit: 100},
	}
	if d := cmp.Diff(want, r); d != "" {
		t.Fatalf("conservative reservation (-want +got):\n%s", d)
	}
	if got := r.Scopes(true); len(got) != 6 || got[5].Kind != registry.ScopeTenantRetry || len(r.BaseScopes) != 5 {
		t.Fatalf("Scopes(true) = %v", got)
	}
	imp := registry.ImplicitAdmissionPolicy()
	imp.MaxTenantRetryInFlight = registry.Unlimited
	r = registry.NewReservation(&imp, &b, "ctype_x", key)
	if r.PolicyRef != "" || len(r.BaseScopes) != 3 || r.RetryScope != nil {
		t.Fatalf("unlimited counters are reserved: %+v", r)
	}
	err := registry.CapacityExceeded(want.BaseScopes[1])
	var ce *registry.CapacityExceededError
	if !errors.As(err, &ce) || !errors.Is(err, registry.ErrCapacityExceeded) || ce.RetryAfter != registry.DefaultRetryAfter || ce.Scope != registry.ScopeTenant {
		t.Fatalf("CapacityExceeded = %#v", err)
	}
}

func TestApplySettlementToCircuit(t *testing.T) {
	now := registrytest.Epoch
	res := &registry.AdmissionReservation{CircuitFailureThreshold: 2, CircuitOpenMS: 1000}
	c := registry.CircuitState{}
	c = registry.ApplySettlementToCircuit(c, registry.SettlementOutcomeUnknown, res, now)
	if c.ConsecutiveFailures != 1 || !c.Closed(now) {
		t.Fatalf("after one failure: %+v", c)
	}
	c = registry.ApplySettlementToCircuit(c, registry.SettlementOutcomeUnknown, res, now)
	if !c.OpenUntil.Equal(now.Add(time.Second)) || c.Closed(now) || !c.Closed(now.Add(time.Second)) {
		t.Fatalf("at the threshold: %+v", c)
	}
	// A later failure never shortens an open circuit.
	res2 := &registry.AdmissionReservation{CircuitFailureThreshold: 2, CircuitOpenMS: 100}
	c = registry.ApplySettlementToCircuit(c, registry.SettlementOutcomeUnknown, res2, now)
	if !c.OpenUntil.Equal(now.Add(time.Second)) || c.ConsecutiveFailures != 3 {
		t.Fatalf("a shorter reopen shortened the circuit: %+v", c)
	}
	for _, o := range []registry.RouteSettlement{registry.SettlementCancelled, registry.SettlementLeaseExpired} {
		if got := registry.ApplySettlementToCircuit(c, o, res, now); got != c {
			t.Fatalf("%s changed the circuit to %+v", o, got)
		}
	}
	if got := registry.ApplySettlementToCircuit(c, registry.SettlementCompleted, res, now); got != (registry.CircuitState{}) {
		t.Fatalf("completed left %+v", got)
	}
}

func TestReplicaWireRoundTrip(t *testing.T) {
	r := registrytest.Replica("crepl_a", "cinst_a", "cver_a", registrytest.Epoch.Add(1234567*time.Microsecond))
	r.LastControlRequestID, r.LastControlRequestDigest = "msg_1", registrytest.Digest("x")
	r.Normalize()
	w := r.Wire()
	back := registry.ReplicaFromWire(&w)
	if !registry.ReplicaEqual(&back, &r) {
		t.Fatalf("round trip\n got %+v\nwant %+v", back, r)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLimits(t *testing.T) {
	l := registry.DefaultLimits()
	if l.MaxPageSize != 200 || l.MaxPageBytes != 4<<20 || l.MaxCapabilityBytes != 256<<10 || l.MaxManifestBytes != 4<<20 || l.MaxCapabilitiesPerVersion != 512 {
		t.Fatalf("defaults %+v", l)
	}
	for in, want := range map[int]int{-1: 1, 0: 1, 1: 1, 50: 50, 200: 200, 201: 200} {
		if got := l.ClampPageSize(in); got != want {
			t.Errorf("ClampPageSize(%d) = %d, want %d", in, got, want)
		}
	}
	if err := (registry.Limits{MaxCapabilityBytes: 10, MaxPageBytes: 5}).Validate(); !errors.Is(err, registry.ErrInvalid) {
		t.Fatalf("a capability larger than a page: %v", err)
	}
}

func TestPrepareVersionClaims(t *testing.T) {
	c := registrytest.Capability("x.tx", "transactional")
	c.Contract.Transaction = &aip.TransactionContract{SupportedModes: []aip.TransactionMode{aip.TxExecute, aip.TxReconcile, aip.TxCommit}}
	c.Contract.Credentials = &aip.CredentialsContract{Required: true}
	approval := true
	c.RequiresHumanApproval = &approval
	m := registrytest.Manifest("service:x", []aip.Capability{c})
	full := registrytest.Version("cver_x", "ctype_x", "1", "o", registry.VersionActive, m)
	if _, err := registry.PrepareVersion(full, registry.Limits{}); err != nil {
		t.Fatalf("full claims: %v", err)
	}
	for _, drop := range []string{"Reconciliation", "Transaction", "Credentials", "Approval", "Cancellation", "Invocation"} {
		v := full.Clone()
		s := v.ImplementationSupport["x.tx"]
		reflect.ValueOf(&s).Elem().FieldByName(drop).SetBool(false)
		v.ImplementationSupport["x.tx"] = s
		_, err := registry.PrepareVersion(v, registry.Limits{})
		var fe *registry.FieldError
		if !errors.As(err, &fe) || fe.Field != "implementation_support.x.tx" || !strings.Contains(fe.Reason, strings.ToLower(drop)) {
			t.Errorf("without %s: %v", drop, err)
		}
	}
	// Streaming, retry and compensation are not promised: not required.
	v := full.Clone()
	s := v.ImplementationSupport["x.tx"]
	s.Streaming, s.Retry, s.Compensation = false, false, false
	v.ImplementationSupport["x.tx"] = s
	if _, err := registry.PrepareVersion(v, registry.Limits{}); err != nil {
		t.Fatalf("claims beyond the contract are optional: %v", err)
	}
}

func TestFieldError(t *testing.T) {
	err := (&registry.ConnectorType{ID: "ctype_x", Name: "", Owner: "o"}).Validate()
	var fe *registry.FieldError
	if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) || fe.Field != "name" || fe.Record != registry.RecordConnectorType || fe.ID != "ctype_x" {
		t.Fatalf("Validate = %#v", err)
	}
	if got := err.Error(); got != "registry: invalid: connector_type ctype_x: name: is empty" {
		t.Fatalf("message %q", got)
	}
}

// TestIdentifiersRefuseInvisibleCharacters: an identifier holding a
// Unicode formatting character (zero-width space, bidirectional control)
// would print like another; it is refused naming the character. A name
// may hold one (a Persian name's zero-width non-joiner).
func TestIdentifiersRefuseInvisibleCharacters(t *testing.T) {
	for _, tenant := range []string{"acme\u200b", "\u202eemca", "ac\u2060me", "\ufeffacme"} {
		q := registry.RouteRequest{TenantID: tenant, ActionID: aip.NewActionID(), CapabilityID: "notes.read"}
		err := q.Validate()
		var fe *registry.FieldError
		if !errors.As(err, &fe) || fe.Field != "tenant_id" || !strings.Contains(err.Error(), "invisible formatting character U+") {
			t.Errorf("tenant %+q: Validate = %v", tenant, err)
		}
	}
	q := registry.RouteRequest{TenantID: "acme", ActionID: aip.NewActionID(), CapabilityID: "notes.re\u200dad"}
	if err := q.Validate(); err == nil || !strings.Contains(err.Error(), "capability_id") {
		t.Errorf("capability with a zero-width joiner: Validate = %v", err)
	}
	if err := (&registry.ConnectorType{ID: "ctype_x", Name: "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", Owner: "o"}).Validate(); err != nil {
		t.Errorf("a name with a zero-width non-joiner: %v", err)
	}
}

// TestFormatCharacter: FormatCharacter finds the first character the
// identifier rule refuses, and nothing in a plain or Persian identifier
// without one.
func TestFormatCharacter(t *testing.T) {
	for v, want := range map[string]rune{"acme\u200b": 0x200b, "\u202eemca\u200d": 0x202e, "t\U000e0041": 0xe0041, "a\u00adb": 0xad} {
		if r, ok := registry.FormatCharacter(v); !ok || r != want {
			t.Errorf("FormatCharacter(%+q) = U+%04X, %v; want U+%04X", v, r, ok, want)
		}
	}
	for _, v := range []string{"", "acme", "t\u00e9nant", "\u0645\u06cc"} {
		if r, ok := registry.FormatCharacter(v); ok {
			t.Errorf("FormatCharacter(%+q) = U+%04X, want none", v, r)
		}
	}
}

// TestHandOutIsBookkeeping: an assignment's hand-out is not part of the
// route: Equal (settlement's fence comparison) ignores it, the
// security.connector_route a replica receives does not carry it, and a
// JSON written without it decodes as hand-out 0.
func TestHandOutIsBookkeeping(t *testing.T) {
	a := sampleAssignment()
	a.HandOut = 3
	b := a.Clone()
	b.HandOut = 4
	if !a.Equal(&b) || !b.Equal(&a) {
		t.Fatal("Equal compares hand-outs")
	}
	if b.HandOut != 4 {
		t.Fatal("Clone dropped the hand-out")
	}
	ra, rb := a.Route(nil), b.Route(nil)
	wa, err := json.Marshal(ra)
	if err != nil {
		t.Fatal(err)
	}
	wb, err := json.Marshal(rb)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(wa, wb) || bytes.Contains(wa, []byte("hand_out")) {
		t.Fatalf("the connector_route depends on the hand-out: %s / %s", wa, wb)
	}
	doc, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back registry.RouteAssignment
	if err := json.Unmarshal(doc, &back); err != nil || back.HandOut != 3 {
		t.Fatalf("the hand-out does not survive JSON: %d, %v", back.HandOut, err)
	}
	old := bytes.Replace(doc, []byte(`,"hand_out":3`), nil, 1)
	if bytes.Equal(old, doc) {
		t.Fatalf("no hand_out member in %s", doc)
	}
	back = registry.RouteAssignment{}
	if err := json.Unmarshal(old, &back); err != nil || back.HandOut != 0 || !back.Equal(&a) {
		t.Fatalf("an assignment written before hand-outs decodes as hand-out %d (%v), want 0 and the same route", back.HandOut, err)
	}
}
