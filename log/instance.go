package log

import (
	"fmt"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

var metaInstanceID = []byte("instance-id")

// InstanceID names this log file: "ins_" and a ULID, made when the file is
// created and kept for its life (a copy of the file carries it too). bbolt's
// file lock lets one process at a time hold a log, so a worker can tell its
// own previous process's leftovers from another worker's by it.
func (db *DB) InstanceID() string { return db.instance }

// ensureInstanceID reads the file's instance id, making it on first open.
func ensureInstanceID(b *bolt.DB) (string, error) {
	var id string
	err := b.View(func(tx *bolt.Tx) error {
		id = string(tx.Bucket(bucketMeta).Get(metaInstanceID))
		return nil
	})
	if err != nil || id != "" {
		return id, err
	}
	err = b.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(metaInstanceID); v != nil {
			id = string(v)
			return nil
		}
		id = "ins_" + ulid.Make().String()
		return meta.Put(metaInstanceID, []byte(id))
	})
	if err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	return id, nil
}
