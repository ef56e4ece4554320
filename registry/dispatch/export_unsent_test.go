package dispatch

// SetMaxPendingUnsentReleases sets how many releases of unsent hand-outs
// d keeps pending in the background (maxPendingUnsentReleases), before it
// serves a request.
func SetMaxPendingUnsentReleases(d *Dispatcher, n int) { d.maxUnsentPending = n }
