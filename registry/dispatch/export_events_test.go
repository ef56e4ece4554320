package dispatch

// EventBodyPeers is the number of sender addresses that hold or wait for
// part of d's read budget of connector-event deliveries.
func EventBodyPeers(d *Dispatcher) int { return d.eventBodies.Stats().Peers }
