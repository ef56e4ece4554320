// Package onchange reports when a value differs from the one last
// reported, so that a state polled often (a /ready probe's failing checks)
// is logged when it changes rather than at every poll.
package onchange

import "sync/atomic"

// Text remembers the text last reported. The zero value has reported
// nothing; "" stands for the healthy state, so a Text that starts healthy
// reports nothing until the first failure. It is safe for concurrent use:
// of concurrent callers seeing the same change, one reports it.
type Text struct {
	last atomic.Pointer[string]
}

// Changed reports whether now differs from the text last reported (or, at
// first, from ""), and records it when it does.
func (t *Text) Changed(now string) bool {
	last := t.last.Load()
	if (last == nil && now == "") || (last != nil && *last == now) {
		return false
	}
	return t.last.CompareAndSwap(last, &now)
}
