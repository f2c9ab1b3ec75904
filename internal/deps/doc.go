// Package deps holds no code: its test asserts the import rules of the
// tree (which packages may link NATS, bbolt, echo or the benchmark's
// dependencies), so that a later change cannot drag a heavy dependency
// into a light import.
package deps
