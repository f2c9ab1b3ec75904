package log

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/convlog/convlog/log/record"
)

// An instance is the set of an agent's streams that share an instance name,
// in one generation. Its row in the instances bucket is written in the same
// transaction as every admission (and every lifecycle change), together
// with its key in the activity index, so that listing an agent's instances
// newest first is a cursor walk over that index: its cost is the page's,
// whatever the number of records, sessions or instances.
//
// The generation uid is made when the row is made: by the first delivery to
// the instance (which may name the uid it wants, pinning it), or by a fork
// into a new instance. Deleting the instance removes the row; the uid then
// goes to the ended-generations bucket, so that a delivery still naming it
// is refused as stale instead of reviving a generation that ended.

// instanceMeta is an instance's row.
type instanceMeta struct {
	UID      string `json:"uid"`
	Created  int64  `json:"created"`  // unix nanoseconds
	Activity int64  `json:"activity"` // unix nanoseconds of the last admission or change
}

// InstanceInfo is an instance as the listings show it.
type InstanceInfo struct {
	Instance       string    `json:"instanceId"`
	UID            string    `json:"uid"`
	CreatedAt      time.Time `json:"createdAt"`
	LastActivityAt time.Time `json:"lastActivityAt"`
	// Sessions are the names of its sessions, in name order.
	Sessions []string `json:"sessions"`
}

// SessionInfo is one session of an instance.
type SessionInfo struct {
	Session        string             `json:"session"`
	Incarnation    record.Incarnation `json:"incarnation"`
	TailOffset     record.Offset      `json:"tailOffset"`
	LastActivityAt time.Time          `json:"lastActivityAt"`
	Running        int                `json:"running"`
	Queued         int                `json:"queued"`
	// Waiting counts the submissions that are input_required: waiting for
	// a person, or decided and not yet resumed.
	Waiting int `json:"waiting"`
}

// StaleGenerationError is the ErrStaleGeneration of a delivery: it carries
// the instance's current uid, empty when the instance has none (it was
// deleted and not delivered to since).
type StaleGenerationError struct {
	Named, Current string
}

func (e *StaleGenerationError) Error() string {
	return fmt.Sprintf("%v: uid %q is not the instance's current generation %q", ErrStaleGeneration, record.Clip(e.Named, 40), e.Current)
}

func (e *StaleGenerationError) Unwrap() error { return ErrStaleGeneration }

func instanceKey(agent, instance string) []byte { return []byte(agent + "\x00" + instance) }

func activityKey(agent, instance string, at int64) []byte {
	k := make([]byte, 0, len(agent)+1+8+len(instance))
	k = append(k, agent...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(at))
	return append(k, instance...)
}

func endedKey(agent, instance, uid string) []byte {
	return []byte(agent + "\x00" + instance + "\x00" + uid)
}

func loadInstance(tx *bolt.Tx, agent, instance string) (instanceMeta, bool, error) {
	v := tx.Bucket(bucketInstances).Get(instanceKey(agent, instance))
	if v == nil {
		return instanceMeta{}, false, nil
	}
	var m instanceMeta
	if err := json.Unmarshal(v, &m); err != nil {
		return instanceMeta{}, false, fmt.Errorf("instance %s/%s: %w", agent, instance, err)
	}
	return m, true, nil
}

// generationFor checks a delivery's uid against the instance and returns
// the instance as the admission will leave it. Read-only: for prepare.
func generationFor(tx *bolt.Tx, agent, instance, named string, now time.Time) (m instanceMeta, existed bool, err error) {
	m, existed, err = loadInstance(tx, agent, instance)
	if err != nil {
		return instanceMeta{}, false, err
	}
	if existed {
		if named != "" && named != m.UID {
			return instanceMeta{}, false, &StaleGenerationError{Named: named, Current: m.UID}
		}
		return m, true, nil
	}
	if named != "" {
		if tx.Bucket(bucketEnded).Get(endedKey(agent, instance, named)) != nil {
			return instanceMeta{}, false, &StaleGenerationError{Named: named}
		}
		m.UID = named
	} else {
		m.UID = newUID()
	}
	m.Created = now.UnixNano()
	return m, false, nil
}

func newUID() string { return "gen_" + ulid.Make().String() }

// touchInstance stores the instance row with its activity at now, moving
// its key in the activity index.
func touchInstance(tx *bolt.Tx, agent, instance string, m instanceMeta, existed bool, now time.Time) error {
	act := tx.Bucket(bucketActivity)
	if existed {
		if err := act.Delete(activityKey(agent, instance, m.Activity)); err != nil {
			return err
		}
	}
	m.Activity = max(now.UnixNano(), m.Activity)
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketInstances).Put(instanceKey(agent, instance), v); err != nil {
		return err
	}
	return act.Put(activityKey(agent, instance, m.Activity), nil)
}

// touchExisting moves an existing instance's activity to now; an instance
// without a row (a stream written without any delivery) gets one.
func touchExisting(tx *bolt.Tx, agent, instance string, now time.Time) (instanceMeta, error) {
	m, ok, err := loadInstance(tx, agent, instance)
	if err != nil {
		return instanceMeta{}, err
	}
	if !ok {
		m = instanceMeta{UID: newUID(), Created: now.UnixNano()}
	}
	if err := touchInstance(tx, agent, instance, m, ok, now); err != nil {
		return instanceMeta{}, err
	}
	m.Activity = max(now.UnixNano(), m.Activity)
	return m, nil
}

// Generation returns the instance's current uid, "" when it has none.
func (db *DB) Generation(ctx context.Context, agent, instance string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var uid string
	err := db.view(func(tx *bolt.Tx) error {
		m, ok, err := loadInstance(tx, agent, instance)
		if ok {
			uid = m.UID
		}
		return err
	})
	return uid, err
}

// MaxInstancesPage bounds a page of Instances.
const MaxInstancesPage = 1000

// MaxInstancesScan bounds the rows of the activity index one page of
// InstancesVisible walks past, listed or not: a caller who may see few of
// an agent's instances gets a short page (and a next cursor) rather than a
// walk over every instance.
const MaxInstancesScan = 10 * MaxInstancesPage

// Instances lists up to limit instances of agent, newest activity first,
// after cursor (the next value of the previous page; "" for the first).
// next is "" after the last page.
func (db *DB) Instances(ctx context.Context, agent, cursor string, limit int) (list []InstanceInfo, next string, err error) {
	return db.InstancesVisible(ctx, agent, cursor, limit, nil)
}

// InstancesVisible is Instances of the instances visible (nil: all)
// reports true for: the filter runs during the walk, so that a page is
// made of visible instances only, and next is the position of the last
// visible one listed, or, when MaxInstancesScan rows went by first, of the
// last row walked past (a page may then come out short, even empty, with a
// next cursor). The cursor is the raw index key: callers that hand it to
// someone who may not see every instance must seal it.
func (db *DB) InstancesVisible(ctx context.Context, agent, cursor string, limit int, visible func(instance string) bool) (list []InstanceInfo, next string, err error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if err := record.ValidateName(agent); err != nil {
		return nil, "", fmt.Errorf("instances: agent: %w", err)
	}
	if limit <= 0 || limit > MaxInstancesPage {
		limit = 100
	}
	prefix := append([]byte(agent), 0)
	var from []byte
	if cursor != "" {
		from, err = base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || !bytes.HasPrefix(from, prefix) || len(from) < len(prefix)+8 {
			return nil, "", fmt.Errorf("%w: instances cursor", ErrInvalidOffset)
		}
	}
	list = []InstanceInfo{}
	err = db.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketActivity).Cursor()
		var k []byte
		if from != nil {
			k, _ = c.Seek(from)
			if k == nil {
				k, _ = c.Last()
			}
			for k != nil && bytes.Compare(k, from) >= 0 {
				k, _ = c.Prev()
			}
		} else {
			// The first key past the agent's range, then back.
			end := append([]byte(agent), 1)
			if k, _ = c.Seek(end); k == nil {
				k, _ = c.Last()
			} else {
				k, _ = c.Prev()
			}
		}
		streams := tx.Bucket(bucketStreams).Cursor()
		scanned := 0
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(k) >= len(prefix)+8; k, _ = c.Prev() {
			if len(list) == limit {
				next = base64.RawURLEncoding.EncodeToString(list[len(list)-1].cursor(agent))
				return nil
			}
			if scanned == MaxInstancesScan {
				// The previous row is where the next page resumes: it was
				// walked past, listed or not.
				k, _ = c.Next()
				next = base64.RawURLEncoding.EncodeToString(k)
				return nil
			}
			scanned++
			name := string(k[len(prefix)+8:])
			if visible != nil && !visible(name) {
				continue
			}
			m, ok, err := loadInstance(tx, agent, name)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			info := InstanceInfo{Instance: name, UID: m.UID, CreatedAt: time.Unix(0, m.Created).UTC(),
				LastActivityAt: time.Unix(0, m.Activity).UTC(), Sessions: []string{}}
			sp := []byte(agent + "\x00" + name + "\x00")
			for sk, _ := streams.Seek(sp); sk != nil && bytes.HasPrefix(sk, sp); sk, _ = streams.Next() {
				info.Sessions = append(info.Sessions, string(sk[len(sp):]))
			}
			list = append(list, info)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("instances of %s: %w", agent, err)
	}
	return list, next, nil
}

func (i InstanceInfo) cursor(agent string) []byte {
	return activityKey(agent, i.Instance, i.LastActivityAt.UnixNano())
}

// Sessions lists an instance's sessions in name order. An instance that
// does not exist is ErrInstanceNotFound.
func (db *DB) Sessions(ctx context.Context, agent, instance string) ([]SessionInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := []SessionInfo{}
	err := db.view(func(tx *bolt.Tx) error {
		_, ok, err := loadInstance(tx, agent, instance)
		if err != nil {
			return err
		}
		sp := []byte(agent + "\x00" + instance + "\x00")
		c := tx.Bucket(bucketStreams).Cursor()
		for k, v := c.Seek(sp); k != nil && bytes.HasPrefix(k, sp); k, v = c.Next() {
			meta, err := decodeStreamMeta(v)
			if err != nil {
				return err
			}
			si := SessionInfo{Session: string(k[len(sp):]), Incarnation: incarnationOf(meta.inc),
				TailOffset: record.OffsetOf(meta.next), LastActivityAt: lastActivity(tx, meta)}
			subs, err := submissionsUnder(tx, bucketQueue, u64(meta.id), maxListedQueue)
			if err != nil {
				return err
			}
			for _, s := range subs {
				switch s.Status {
				case record.StatusRunning:
					si.Running++
				case record.StatusInputRequired:
					si.Waiting++
				default:
					si.Queued++
				}
			}
			out = append(out, si)
		}
		if !ok && len(out) == 0 {
			return fmt.Errorf("%w: %s/%s", ErrInstanceNotFound, agent, instance)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sessions of %s/%s: %w", agent, instance, err)
	}
	return out, nil
}

// maxListedQueue bounds the submissions a session listing counts.
const maxListedQueue = 10000

// lastActivity is the timestamp of the stream's newest entry: one batch
// read, the last.
func lastActivity(tx *bolt.Tx, meta streamMeta) time.Time {
	fallback := time.Unix(0, meta.created).UTC()
	if meta.next == 0 {
		return fallback
	}
	c := tx.Bucket(bucketBatches).Cursor()
	k, _ := c.Seek(u64(meta.id + 1))
	if k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	for ; k != nil && binary.BigEndian.Uint64(k) == meta.id; k, _ = c.Prev() {
		_, array, err := decodeBatchHeader(tx.Bucket(bucketBatches).Get(k))
		if err != nil {
			return fallback
		}
		var recs []struct {
			Entry *struct {
				Timestamp time.Time `json:"timestamp"`
			} `json:"entry"`
		}
		if json.Unmarshal(array, &recs) != nil {
			return fallback
		}
		for i := len(recs) - 1; i >= 0; i-- {
			if recs[i].Entry != nil {
				return recs[i].Entry.Timestamp.UTC()
			}
		}
	}
	return fallback
}
