package projection

import "github.com/convlog/convlog/log/record"

// ActivePath is the entries on the active path after records, root first,
// found from parent links alone: the chain of ParentID from the final leaf
// through every entry seen. It shares the Projector's reading of the leaf
// (skipped entries and truncations are skipped here too) but none of its
// path bookkeeping, which makes it an independent account of what the view
// should show.
//
// An entry whose parent was never seen ends the chain here, where the
// Projector would have hung it on the leaf of the moment; the two agree
// whenever every parent is known, as it is in anything the engine stores.
func ActivePath(records []record.Record) []record.Entry {
	entries := make(map[string]*record.Entry)
	known := func(id string) bool { return entries[id] != nil }
	leaf := ""
	for i := range records {
		switch r := &records[i]; r.Kind {
		case record.KindEntry:
			if e := r.Entry; e != nil && e.ID != "" && !known(e.ID) {
				entries[e.ID] = e
				leaf = e.ID
			}
		case record.KindTruncated:
			if l, ok := truncationLeaf(r, known); ok {
				leaf = l
			}
		}
	}
	var path []record.Entry
	// Records the engine never wrote can make the links a loop.
	seen := make(map[string]bool)
	for id := leaf; id != "" && known(id) && !seen[id]; id = entries[id].ParentID {
		seen[id] = true
		path = append(path, *entries[id])
	}
	for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
		path[i], path[j] = path[j], path[i]
	}
	return path
}

// truncationLeaf is the leaf a truncation moves to: its newLeafId, or its
// rewoundTo when there is none ("" being the very start). ok is false when
// that is an entry never seen: there is nowhere to move to, and dropping the
// whole path on a guess would lose more than it fixes.
func truncationLeaf(r *record.Record, known func(string) bool) (leaf string, ok bool) {
	leaf = r.NewLeafID
	if leaf == "" {
		leaf = r.RewoundTo
	}
	return leaf, leaf == "" || known(leaf)
}
