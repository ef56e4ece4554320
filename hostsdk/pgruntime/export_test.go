package pgruntime

import "context"

// SetAfterConflict makes BeginAction and AcceptAction run f when they
// find their action journaled already, before they read its record.
func (j *Journal) SetAfterConflict(f func()) { j.afterConflict = f }

// SessionSetting returns what a session of the journal's pool shows for
// the setting name.
func (j *Journal) SessionSetting(ctx context.Context, name string) (string, error) {
	var v string
	err := j.pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}

// LockSessionSetting returns what the session holding the journal's
// namespace lock shows for the setting name.
func (j *Journal) LockSessionSetting(ctx context.Context, name string) (string, error) {
	j.lock.mu.Lock()
	defer j.lock.mu.Unlock()
	var v string
	err := j.lock.conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}
