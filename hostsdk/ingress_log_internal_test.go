package hostsdk

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestSenderWentAway: only a journal error that is the request's own
// context ending is the sender going away (logged at info); a journal
// deadline of its own — a PostgreSQL connect timeout during an outage,
// after the sender gave up too — is a journal failure (logged as an error).
func TestSenderWentAway(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"read cancelled with the request", gone, fmt.Errorf("journal: read action: %w", context.Canceled), true},
		{"journal timeout after the sender left", gone, fmt.Errorf("pgruntime: connect: %w", context.DeadlineExceeded), false},
		{"journal failure after the sender left", gone, errors.New("database or disk is full"), false},
		{"cancelled while the sender waits", live, fmt.Errorf("journal: %w", context.Canceled), false},
	} {
		if got := senderWentAway(c.ctx, c.err); got != c.want {
			t.Errorf("%s: senderWentAway = %v, want %v", c.name, got, c.want)
		}
	}
}
