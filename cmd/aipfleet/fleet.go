package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
)

// DefaultControlURL is where the fleet commands find the control plane by
// default: the address of aipfleet control-plane and of aipfleet dev.
const DefaultControlURL = "http://127.0.0.1:8090"

func fleetCommand() *command {
	return &command{
		name:      "fleet",
		summary:   "show the fleet: every replica's state, lease, load and circuit",
		usage:     "status [--watch] [--json] [--all] [flags]",
		envPrefix: "AIP_FLEET_",
		long: `fleet status reads the control plane's fleet views (GET
/aip/v1/fleet/replicas and /aip/v1/fleet/status) and prints one line per
replica: its ID, its instance, its state (ready, draining, offline, or
expired when a ready or draining replica's lease ran out before lease
maintenance took it offline), how long its lease still runs, its active
assignments over its capacity, and its circuit (closed, or open with the
time it reopens and the unknown outcomes that opened it). It lists the live
replicas (ready, draining, expired), those pre-provisioned and not yet
registered, and those that went offline in the last 24 hours; replicas
offline for longer are retired (a replaced replica's ID is never used again)
and counted, not listed: --all lists them too. An offline replica's state
says why it went offline: "offline (shutdown)" its host shut down cleanly,
"offline (unhealthy)" its host reported its connector or journal failing,
"offline (lease_expired)" its lease ran out without a heartbeat (the host
crashed, hung or lost the control plane), "offline (administrator)" an
administrator wrote it offline; plain "offline" if it never registered
(or went offline before the registry recorded why). --wide adds when.
A summary line follows: the live replicas by state, then the offline ones
(never registered, offline within 24 hours, retired).

--watch redraws the table in place every --interval until Ctrl-C;
--json prints the two views as one JSON document (one per interval with
--watch), its replicas those the table lists. The control plane is
--control-url; without it (or its variable), the control plane of the
aipfleet dev fleet whose state is in --dev-state-dir,
at the port dev recorded there, else 127.0.0.1:8090 (where aipfleet
control-plane listens by default).

The fleet views are for operators: the request carries --token (an
operator token, see aipfleet token --operator), or one minted for 15
minutes with --issuer-key (an issuer the control plane trusts with
--operator-issuer NAME=DID, NAME = --issuer). With neither, it mints one
with the issuer key of aipfleet dev's state directory, which the dev
control plane trusts.`,
		examples: []string{
			"aipfleet fleet status",
			"aipfleet fleet status --watch",
			"aipfleet fleet status --json | jq '.replicas[] | select(.status != \"ready\")'",
			"AIP_FLEET_CONTROL_URL=https://control.example.net:8090 AIP_FLEET_TOKEN=$(cat ops.token) aipfleet fleet status --wide",
			"aipfleet fleet status --control-url https://control.example.net:8090 --issuer-key ops.key --issuer ops",
		},
		run: runFleet,
	}
}

// fleetView is what fleet status shows: both fleet views at one moment.
type fleetView struct {
	Status   registry.FleetStatusSummary `json:"status"`
	Replicas []controlplane.FleetReplica `json:"replicas"`
}

func runFleet(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	controlURL := fs.String("control-url", DefaultControlURL, "the control plane's base URL")
	watch := fs.Bool("watch", false, "redraw the table in place every --interval until Ctrl-C")
	interval := fs.Duration("interval", time.Second, "refresh interval of --watch (100ms to 1h)")
	asJSON := fs.Bool("json", false, "print JSON: {\"status\": ..., \"replicas\": [...]}")
	wide := fs.Bool("wide", false, "add each replica's version, endpoint, topology, health revision and when it went offline")
	all := fs.Bool("all", false, "list retired replicas too (offline for more than 24h)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on each read of the control plane")
	caFile := fs.String("ca-file", "", "extra PEM root CA for an https control plane")
	token := fs.String("token", "", "operator bearer token (see aipfleet token --operator)")
	issuerKey := fs.String("issuer-key", "", "mint a 15-minute operator token with this issuer key file (mode 0600)")
	issuer := fs.String("issuer", devIssuer, "issuer name (iss claim) of minted tokens")
	devStateDir := fs.String("dev-state-dir", DefaultDevStateDir, "aipfleet dev's state directory: without --control-url, its control plane (dev.json); without --token or --issuer-key, mint with its issuer key (keys/issuer.key)")
	fs.NoEnv("watch")
	fs.NoEnv("json")
	if _, err := fs.subcommand(args, e.stdout, "status"); err != nil {
		return err
	}
	if err := fs.parse(args[1:], e.stdout); err != nil {
		return err
	}
	if len(fs.args()) > 0 {
		return usagef("fleet status: unexpected argument %q", fs.args()[0])
	}
	if err := fs.notEmpty("fleet status", map[string]string{
		"token":         "give an operator token, or leave --token out to mint one with an issuer key",
		"issuer-key":    "give the issuer key file, or leave --issuer-key out to use aipfleet dev's",
		"dev-state-dir": "give aipfleet dev's state directory, or leave the flag out for " + DefaultDevStateDir,
	}); err != nil {
		return err
	}
	from, err := devDefaultURL(fs, "control-url", controlURL, *devStateDir, func(u devURLs) string { return u.control })
	if err != nil {
		return err
	}
	defaulted := ""
	if from == "" && !fs.isSet("control-url") {
		defaulted = noDevStateNote(*devStateDir)
	}
	base, err := baseURL("--control-url", *controlURL, DefaultControlURL)
	if err != nil {
		return err
	}
	if *interval < 100*time.Millisecond || *interval > time.Hour {
		return usagef("fleet status: --interval %s is outside 100ms..1h", *interval)
	}
	if fs.given["interval"] > 0 && !*watch {
		// Without --watch the table is printed once: the interval would
		// be ignored. (Its variable is a setting for --watch, and quiet.)
		return usagef("fleet status: --interval is for --watch, which redraws the table every interval; add --watch")
	}
	if *timeout <= 0 {
		return usagef("fleet status: --timeout must be positive")
	}
	bearer, err := operatorBearer(*token, *issuerKey, *issuer, *devStateDir)
	if err != nil {
		return err
	}
	// One control plane, one request at a time.
	client, err := tlsClient("fleet status", "--ca-file", *caFile, 2, 2)
	if err != nil {
		return err
	}
	client.Timeout = *timeout
	defer client.CloseIdleConnections()
	show := func(now time.Time, v *fleetView) error {
		retired := 0
		if !*all {
			retired = dropRetired(v, now)
		}
		if *asJSON {
			return writeJSON(e.stdout, v)
		}
		printFleet(e.stdout, v, now, *wide, retired)
		return nil
	}
	if !*watch {
		v, err := readFleet(ctx, client, base, from, defaulted, bearer)
		if err != nil {
			return err
		}
		return show(time.Now(), v)
	}
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		v, err := readFleet(ctx, client, base, from, defaulted, bearer)
		if ctx.Err() != nil {
			return nil // Ctrl-C ends the watch
		}
		if !*asJSON {
			fmt.Fprint(e.stdout, "\x1b[H\x1b[2J") // home, clear screen
			fmt.Fprintf(e.stdout, "%s  every %s  (Ctrl-C to stop)\n\n", time.Now().Format("15:04:05"), *interval)
		}
		if err != nil {
			fmt.Fprintf(e.stdout, "aipfleet: %v\n", err)
		} else if err := show(time.Now(), v); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// baseURL checks an http(s) base URL flag and trims its trailing slash;
// its error shows example.
func baseURL(flagName, raw, example string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usagef("%s %q is not an http(s) URL such as %s", flagName, raw, example)
	}
	// The commands add the API's paths themselves: a URL copied with one
	// (…/aip/v1/actions) would be asked for …/aip/v1/actions/aip/v1/actions
	// and answered with a puzzling 404.
	if i := strings.Index(u.Path, "/aip/v1"); i >= 0 {
		u.Path, u.RawPath, u.RawQuery = u.Path[:i], "", ""
		return "", usagef("%s %q names an API path; give the server's base URL only: %s", flagName, raw, strings.TrimRight(u.String(), "/"))
	}
	// The API's paths are appended to the URL as written: a query or a
	// fragment would end up before them (…/?x/aip/v1/actions).
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(raw, "?#") {
		u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = "", false, "", ""
		return "", usagef("%s %q has a query or a fragment; give the server's base URL only: %s", flagName, raw, strings.TrimRight(u.String(), "/"))
	}
	return strings.TrimRight(raw, "/"), nil
}

// fleetBearer gives the fleet views' requests their operator token.
type fleetBearer struct {
	// token returns the token to send ("" for none).
	token func() (string, error)
	// refused says what to do when the control plane refuses it (401).
	refused string
}

// operatorBearer returns where the fleet views' token comes from: --token;
// or a token minted for each read with --issuer-key; or, with neither, one
// minted with aipfleet dev's issuer key when devStateDir has one; else
// none (the control plane's 401 then says what it needs).
func operatorBearer(token, issuerKey, issuer, devStateDir string) (fleetBearer, error) {
	const give = "give --token (aipfleet token --operator) or --issuer-key FILE of an issuer the control plane trusts (aipfleet control-plane --operator-issuer NAME=DID)"
	switch {
	case token != "" && issuerKey != "":
		return fleetBearer{}, usagef("fleet status: give either --token or --issuer-key, not both")
	case token != "":
		return fleetBearer{token: func() (string, error) { return token, nil },
			refused: "check that the control plane trusts the token's issuer and key (--operator-issuer NAME=DID) and that the token has not expired"}, nil
	}
	if issuerKey != "" {
		if err := mintedNameGiven("fleet status", "issuer", issuer); err != nil {
			return fleetBearer{}, err
		}
	}
	refused := "check that the control plane trusts --issuer " + issuer + " with this key (--operator-issuer " + issuer + "=DID, the key's did:key)"
	keyFlag := "--issuer-key"
	if issuerKey == "" {
		dev := filepath.Join(devStateDir, "keys", "issuer.key")
		if _, err := os.Stat(dev); err != nil {
			noToken := give
			if note := noDevStateNote(devStateDir); note != "" {
				noToken += "\n(no token was sent, for want of aipfleet dev's issuer key to mint one: " + note + ")"
			}
			return fleetBearer{token: func() (string, error) { return "", nil }, refused: noToken}, nil
		}
		issuerKey, issuer = dev, devIssuer
		keyFlag = "aipfleet dev's issuer key (in --dev-state-dir " + devStateDir + ")"
		refused = "the token was minted with aipfleet dev's issuer key (" + dev + "), which only aipfleet dev trusts; " + give
	}
	key, err := aip.LoadSigningKey(issuerKey)
	if err != nil {
		return fleetBearer{}, flagFileError("fleet status", keyFlag, err)
	}
	return fleetBearer{token: func() (string, error) {
		now := time.Now()
		return tenanttoken.MintOperator(key, tenanttoken.Claims{Issuer: issuer, Audience: tenanttoken.OperatorAudience,
			Subject: "aipfleet-fleet-status", IssuedAt: now, Expiry: now.Add(mintedTokenTTL)})
	}, refused: refused}, nil
}

// readFleet reads every page of the replicas view and the status summary,
// each request with a token from bearer. from and defaulted say where base
// came from, for getJSON.
func readFleet(ctx context.Context, client *http.Client, base, from, defaulted string, bearer fleetBearer) (*fleetView, error) {
	tok, err := bearer.token()
	if err != nil {
		return nil, err
	}
	v := &fleetView{Replicas: []controlplane.FleetReplica{}}
	after := ""
	for {
		q := url.Values{"limit": {"1000"}}
		if after != "" {
			q.Set("after", after)
		}
		var page controlplane.FleetReplicaPage
		if err := getJSON(ctx, client, base+controlplane.PathFleetReplicas+"?"+q.Encode(), tok, bearer.refused, from, defaulted, &page); err != nil {
			return nil, err
		}
		v.Replicas = append(v.Replicas, page.Replicas...)
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if err := getJSON(ctx, client, base+controlplane.PathFleetStatus, tok, bearer.refused, from, defaulted, &v.Status); err != nil {
		return nil, err
	}
	return v, nil
}

// getJSON GETs u with the bearer token (none when empty) into into; a 401
// error adds refused, what to do about it. When nothing answers, the error
// says where the address came from: from, the dev.json it was read from,
// or defaulted, why it is the default (noDevStateNote); both are "" for a
// --control-url given.
func getJSON(ctx context.Context, client *http.Client, u, token, refused, from, defaulted string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			base := strings.SplitN(u, "/aip/", 2)[0]
			if from != "" {
				return fmt.Errorf("no control plane answers at %s%s", base, devAddressNote(from, "control-url"))
			}
			msg := fmt.Sprintf("no control plane answers at %s: start one (aipfleet dev, or aipfleet control-plane) or point --control-url at it", base)
			if defaulted != "" {
				msg += "\n(" + base + " is the default address: " + defaulted + ")"
			}
			return errors.New(msg)
		}
		if cert := asUntrustedCert(err, "the control plane", strings.SplitN(u, "/aip/", 2)[0]); cert != nil {
			return cert
		}
		if speaksTLS(ctx, u, err) {
			return &plainHTTPError{fmt.Errorf("GET %s: %w", u, unwrapURLError(err))}
		}
		// Connected but no answer within --timeout: a stopped or hung
		// control plane (the kernel still accepts its connections), or a
		// path that drops packets.
		var ne net.Error
		if ctx.Err() == nil && client.Timeout > 0 && errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("the control plane at %s did not answer within %s (--timeout): it is stopped, hung or overloaded, or the path to it drops packets; check its process, its /ready and its log (GET %s: %w)",
				strings.SplitN(u, "/aip/", 2)[0], client.Timeout, u, err)
		}
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		if speaksTLS(ctx, u, err) {
			return &plainHTTPError{fmt.Errorf("GET %s: %w", u, err)}
		}
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return fmt.Errorf("GET %s: %w; %s", u, apiFailure(resp.StatusCode, raw), refused)
	}
	if resp.StatusCode == http.StatusNotFound {
		// Every control plane serves the fleet views: this is another
		// server (the dispatcher, a replica, a proxy's wrong route).
		return fmt.Errorf("GET %s: %w\n%s does not serve the control plane's fleet views: is --control-url the control plane? (aipfleet dev prints its address; the dispatcher listens on another port)",
			u, apiFailure(resp.StatusCode, raw), strings.SplitN(u, "/aip/", 2)[0])
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %w", u, apiFailure(resp.StatusCode, raw))
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("GET %s: the answer is not the control plane's fleet view: %v", u, err)
	}
	return nil
}

// replicaState is the state column: the registry status, or expired for a
// ready or draining replica whose lease ran out; an offline replica's
// with why it went offline when the registry recorded it.
func replicaState(r *controlplane.FleetReplica) string {
	switch {
	case r.Status != aip.ReplicaOffline && !r.LeaseValid:
		return "expired"
	case r.Status == aip.ReplicaOffline && r.OfflineReason != "":
		return fmt.Sprintf("offline (%s)", r.OfflineReason)
	}
	return string(r.Status)
}

// offlineSince is the --wide column of when an offline replica went
// offline ("-" when not offline or not recorded), in local time.
func offlineSince(r *controlplane.FleetReplica) string {
	if r.OfflineAt == nil || r.OfflineAt.IsZero() {
		return "-"
	}
	return r.OfflineAt.Local().Format("Jan 2 15:04:05")
}

func leaseRemaining(r *controlplane.FleetReplica, now time.Time) string {
	if r.Status == "offline" || r.LeaseExpiresAt.IsZero() {
		return "-"
	}
	d := r.LeaseExpiresAt.Sub(now)
	if !r.LeaseValid || d <= 0 {
		return "expired"
	}
	return d.Round(100 * time.Millisecond).String()
}

func circuitText(c controlplane.FleetCircuit) string {
	switch {
	case c.Open && c.OpenUntil != nil:
		return fmt.Sprintf("open until %s (%d unknown)", c.OpenUntil.Local().Format("15:04:05"), c.ConsecutiveFailures)
	case c.Open:
		return fmt.Sprintf("open (%d unknown)", c.ConsecutiveFailures)
	case c.ConsecutiveFailures > 0:
		return fmt.Sprintf("closed (%d unknown)", c.ConsecutiveFailures)
	}
	return "closed"
}

// observedAt is the control plane's time of v's summary, which counted
// the retired replicas (now when the summary carries none): judging them
// by the control plane's clock keeps the table and the summary line in
// agreement whatever this machine's clock says.
func observedAt(v *fleetView, now time.Time) time.Time {
	if v.Status.ObservedAt.IsZero() {
		return now
	}
	return v.Status.ObservedAt
}

// dropRetired removes the retired replicas from v, judged at the
// summary's time (observedAt), and returns how many.
func dropRetired(v *fleetView, now time.Time) int {
	now = observedAt(v, now)
	n := len(v.Replicas)
	v.Replicas = slices.DeleteFunc(v.Replicas, func(r controlplane.FleetReplica) bool {
		return registry.Retired(r.Status, r.HealthRevision, r.LeaseExpiresAt.Time, now)
	})
	return n - len(v.Replicas)
}

func printFleet(w io.Writer, v *fleetView, now time.Time, wide bool, retired int) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "REPLICA\tINSTANCE\tSTATE\tLEASE\tACTIVE/CAP\tCIRCUIT"
	if wide {
		head += "\tVERSION\tENDPOINT\tREGION/ZONE/CLASS\tHEALTH REV\tOFFLINE SINCE"
	}
	fmt.Fprintln(tw, head)
	for i := range v.Replicas {
		r := &v.Replicas[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s", r.ID, r.InstanceID, replicaState(r), leaseRemaining(r, now),
			r.ActiveAssignments, r.Capacity, circuitText(r.Circuit))
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s/%s/%s\t%d\t%s", r.VersionID, r.Endpoint, r.Topology.Region, r.Topology.Zone, r.Topology.CapacityClass, r.HealthRevision, offlineSince(r))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	s := v.Status
	switch {
	case len(v.Replicas) == 0 && retired == 0:
		fmt.Fprintln(w, "(no replicas: pre-provision some with a fleet file, aipfleet registry apply -f FILE)")
	case retired > 0:
		fmt.Fprintf(w, "(%s not listed, offline for more than %s; --all lists them)\n", plural(retired, "retired replica"), windowText)
	}
	fmt.Fprintf(w, "\n%s: %d ready, %d draining, %d with an expired lease; ready capacity %d, %s; %s\n",
		plural(s.LiveReplicas, "live replica"), s.ReadyReplicas, s.DrainingReplicas, s.ExpiredLeases, s.ReadyCapacity,
		plural(s.ActiveAssignments, "active assignment"), offlineText(&s))
	fmt.Fprintf(w, "catalog revision %d\n", s.CatalogRevision)
}

// windowText is registry.RecentOfflineWindow as the fleet commands say it
// ("24h").
var windowText = strings.TrimSuffix(strings.TrimSuffix(registry.RecentOfflineWindow.String(), "0s"), "0m")

// offlineText says how many replicas are offline, and which.
func offlineText(s *registry.FleetStatusSummary) string {
	return fmt.Sprintf("%d offline: %d never registered, %d offline within %s, %d retired",
		s.OfflineReplicas, s.UnregisteredReplicas, s.RecentlyOfflineReplicas, windowText, s.RetiredReplicas)
}
