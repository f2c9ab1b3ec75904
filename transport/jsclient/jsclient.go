// Package jsclient holds convlog's JavaScript client (an ESM module with no
// dependencies, and its TypeScript types) and embeds it, so that the binary
// serves it at /client/ for the console and for any page.
//
// The same files are a publishable npm package (package.json). They are
// tested with Node's own test runner against a real convlog serve: go test
// runs them (TestNode), so they are part of make test.
package jsclient

import "embed"

// Files are the client's modules and types: convlog.js, projection.js and
// their .d.ts, at the root of the FS.
//
//go:embed convlog.js convlog.d.ts projection.js projection.d.ts package.json
var Files embed.FS
