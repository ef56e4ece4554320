// Package registry is the connector registry of the fleet: the records that
// turn an authenticated tenant and capability into one durable execution
// target, the rules that keep them consistent, and the five contracts every
// backend implements.
//
// # Records
//
// A ConnectorType is an implementation family and its owner. A
// ConnectorVersion binds a type to one immutable artifact: its manifest
// (capabilities and profiles), manifest digest, ArtifactAttestation and
// implementation-support claims; its lifecycle is candidate, admitted,
// active or revoked. Each capability of an admitted version is published as
// a CapabilityDefinition with contract and schema digests. A
// ConnectorInstance is one tenant's installation at one version; a
// CapabilityBinding makes a tenant and capability eligible to use an
// instance under a priority and an AdmissionPolicy; a ConnectorReplica is a
// pre-provisioned host identity of an instance with its lease, capacity,
// active assignments, health revision and circuit. A RouteAssignment pins one
// action to one replica and is kept after its capacity is released.
//
// # What may change
//
// Identities never change. Instances change only with a strictly newer
// config revision, bindings with a strictly newer policy revision, policies
// with a strictly newer revision, replicas with a strictly newer health
// revision; a revoked version never becomes active again; a capability ID has
// one contract fleet-wide. Each effective catalog write advances the catalog
// revision by one; replica heartbeat, lease and capacity churn never does.
// The Check* functions encode these rules so every backend applies the same
// ones.
//
// # Contracts
//
// Catalog (revision-consistent, tenant-scoped pages), Resolver (resolve, read
// and settle routes), Reader, Administrator and FleetStatus (lease expiry,
// the release of reservations stranded on offline replicas after
// StrandedReservationGrace, aggregate status and the reservation ledger). Beside them: Lifecycle (the
// control plane's signed transitions), Rerouter (the provably-not-started
// reroute, reroute.go), OrphanSettler (settling a reservation no
// dispatcher will settle, unless it was handed out again meanwhile) and
// EventLog (the per-tenant log of provider events the dispatcher's
// connector-event ingress appends, events.go).
// Backends: memregistry (deterministic, in memory) and pgregistry
// (PostgreSQL); both pass registrytest.Run.
//
// # Hand-outs
//
// Every Resolve or Reroute that hands a route out numbers the hand-out
// (RouteAssignment.HandOut): made with the route, returned while held
// (sharing the reservation), or reserved again after a settlement. A
// settlement releases the reservation only for the hand-out that made it
// or a later one sharing it (SettlesReservation), so a dispatcher whose
// reservation lease maintenance released while it was still sending
// cannot, settling late, release the reservation a retry made since; such
// a settlement changes nothing, the circuit included (each hand-out's
// outcome counts once, with its reservation's release). The orphan
// settlement compares the hand-out its caller read with the route's last
// one. Hand-out 0 (an assignment that predates the numbers) settles
// whatever is reserved. Equal and Route ignore the number.
//
// # Routing
//
// A new route filters replicas on the whole chain (enabled binding and
// instance of the tenant, active version of an enabled type implementing the
// capability, replica of that instance and version, ready, unexpired lease,
// spare capacity, closed circuit, capacity class, cross-region constraint)
// and takes the first in CompareCandidates order: binding priority, region
// match, zone match, fewer active assignments, RouteHash, instance and
// replica IDs. Admission scopes (NewReservation) are reserved with the
// replica and never overbooked. An existing route never moves: a retry
// re-reserves its pinned replica or fails with ErrReplicaUnavailable.
//
// # Fleet files
//
// ParseFleetFile reads the declarative YAML description of policies, types,
// versions, instances, bindings and pre-provisioned replicas documented in
// docs/fleet-file.md; Apply applies it idempotently through an
// Administrator and reports what changed.
package registry
