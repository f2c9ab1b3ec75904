package log

import bolt "go.etcd.io/bbolt"

// Empty reports whether the log holds no stream and no submission: a file
// initialised and never written. A data folder whose broker store is gone
// is suspect only when its log is not empty.
func (db *DB) Empty() (bool, error) {
	empty := true
	err := db.view(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketStreams, bucketSubmissions} {
			if k, _ := tx.Bucket(name).Cursor().First(); k != nil {
				empty = false
			}
		}
		return nil
	})
	return empty, err
}
