package pgregistry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// TestLockApply: a second apply waits (told once) until the first releases
// the lock; a wait ends with its context; a released lock is free again.
func TestLockApply(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ctx := context.Background()
	unlock, err := pgregistry.LockApply(ctx, dbURL, func() { t.Error("the first apply was told to wait") })
	if err != nil {
		t.Fatal(err)
	}

	// A waiter whose context ends gives up with the context's error.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	waited := 0
	if _, err := pgregistry.LockApply(short, dbURL, func() { waited++ }); !errors.Is(err, context.DeadlineExceeded) || waited != 1 {
		t.Fatalf("waiting apply with a 200ms deadline: %v (told to wait %d times), want the deadline after one notice", err, waited)
	}

	told := make(chan struct{})
	got := make(chan func(), 1)
	go func() {
		u, err := pgregistry.LockApply(ctx, dbURL, func() { close(told) })
		if err != nil {
			t.Error(err)
			u = func() {}
		}
		got <- u
	}()
	<-told
	select {
	case <-got:
		t.Fatal("the second apply took the lock while the first held it")
	case <-time.After(100 * time.Millisecond): // it keeps waiting
	}
	unlock()
	second := <-got
	second()

	// A released lock is free again.
	third, err := pgregistry.LockApply(ctx, dbURL, func() { t.Error("told to wait for a released lock") })
	if err != nil {
		t.Fatal(err)
	}
	third()
}
