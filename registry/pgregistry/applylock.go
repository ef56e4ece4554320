package pgregistry

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/internal/pgsession"
)

// LockApply takes the registry's apply lock on a connection of its own
// and returns the function that releases it (and closes the connection).
// `aipfleet registry apply` holds it for the whole apply, so two operators
// applying different files run one after the other instead of interleaving
// entry by entry — each entry is its own transaction, and a file's last
// step (disabling the types it marks enabled: false) could otherwise race
// with another file enabling them. It is a session advisory lock, so it
// also ends when the process dies. When another apply holds it, waiting is
// called once and LockApply waits until that apply ends or ctx does.
func LockApply(ctx context.Context, controlURL string, waiting func()) (unlock func(), err error) {
	conn, err := connectApplyLock(ctx, controlURL)
	if err != nil {
		return nil, err
	}
	release := func() {
		// Closing the session releases its advisory locks.
		_ = conn.Close(context.WithoutCancel(ctx))
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, lockClass, lockApply).Scan(&got); err != nil {
		release()
		return nil, fmt.Errorf("pgregistry: take the apply lock: %w", err)
	}
	if !got {
		if waiting != nil {
			waiting()
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, $2)`, lockClass, lockApply); err != nil {
			release()
			if ctxErr := ctx.Err(); ctxErr != nil {
				err = errors.Join(ctxErr, err)
			}
			return nil, fmt.Errorf("pgregistry: wait for the apply lock: %w", err)
		}
	}
	return release, nil
}

// connectApplyLock opens the apply lock's session. The lock lasts as long
// as the session does on the server: should the applying machine die
// mid-apply, the server must notice within minutes, not the hours its TCP
// takes by default, or every later apply waits that long (pgsession).
func connectApplyLock(ctx context.Context, controlURL string) (*pgx.Conn, error) {
	cc, err := parseConnConfig(databaseURL, controlURL)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, connectError(nil, err)
	}
	if err := pgsession.DetectDeadPeer(ctx, conn); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("pgregistry: set up the apply lock's session: %w", err)
	}
	return conn, nil
}
