// Package projection turns a conversation's record stream into the view a
// UI renders: the messages on the active path, with every tool call joined
// to its result, and the settlements of the submissions seen so far.
//
// The package owns that display protocol (View, Message, Part) and the rules
// that produce it. It reads records and nothing else, so a projection can be
// rebuilt at any time from the log, and it imports nothing of convlog's but
// the record types in package log.
//
// # Active path
//
// Entries form a tree through their parentId; the records are one walk over
// it. Each entry normally extends the path, because the engine sets its
// parent to the current leaf. An entry whose parent is an earlier entry
// branches there: the path is rewound to that parent before the entry is
// appended. A truncated record moves the leaf to newLeafId (rewoundTo when
// newLeafId is empty, "" being the very start), and the path becomes the
// chain of ancestors of that leaf. Whatever left the path takes its messages
// and its tool results with it, and whatever joins the path again brings them
// back: the messages are always exactly those of the entries on the active
// path, in path order, so a view never depends on how the path was reached.
//
// # Settlements
//
// A settlement is a terminal fact about a submission, not part of the
// conversation's content, so truncation never removes one. Settlements lists
// each submission once, in the order its first settlement was seen; a later
// settlement for the same submission is ignored, because the first one is
// the one that ended it.
//
// # Leniency
//
// The projection never fails. Readers meet records written by newer versions
// and by other producers, and a view with a piece missing is more useful
// than no view. So unknown record kinds, entry types and part types are
// skipped, as are entries whose payload does not decode (the entry stays on
// the path, it just shows nothing). Records that the engine would never
// store are handled the least destructive way: an entry without an id, or
// with an id already seen, is skipped; an entry whose parent was never seen
// extends the current path; a truncation to an entry never seen is skipped;
// a settlement that names no submission (in its payload or on its entry) or
// no outcome is skipped.
package projection
