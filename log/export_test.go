package log

import "github.com/convlog/convlog/log/record"

// Waiters is how many wait on key's stream now (DB.Wait, Changed and
// Watch subscribers): a test that must not append or close before a
// waiter is registered polls it. Test-only.
func Waiters(db *DB, key record.Key) int {
	db.notify.mu.Lock()
	defer db.notify.mu.Unlock()
	if s := db.notify.slots[string(encodeKey(key))]; s != nil {
		return int(s.refs.Load())
	}
	return 0
}
