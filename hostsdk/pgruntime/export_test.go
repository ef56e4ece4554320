package pgruntime

// SetAfterConflict makes BeginAction and AcceptAction run f when they
// find their action journaled already, before they read its record.
func (j *Journal) SetAfterConflict(f func()) { j.afterConflict = f }
