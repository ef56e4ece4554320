package dispatch

// EventBodyPeers is the number of sender addresses that hold or wait for
// part of d's read budget of connector-event deliveries.
func EventBodyPeers(d *Dispatcher) int { return d.eventBodies.Stats().Peers }

// EventBodyBytesReserved is the part of d's read budget of connector-event
// deliveries reserved by deliveries being read.
func EventBodyBytesReserved(d *Dispatcher) int64 { return d.eventBodies.Stats().Reserved }

// ActionBodyTenants is the number of tenants that hold or wait for part of
// d's read budget of action bodies.
func ActionBodyTenants(d *Dispatcher) int { return d.actionBodies.Stats().Peers }
