// Package console is convlog's web console: plain HTML, CSS and JS modules,
// embedded in the binary and served at /console. It runs on the JS client
// served at /client/convlog.js; there is no build step.
package console

import "embed"

// Files are the console's static files, index.html at the root.
//
//go:embed index.html app.js style.css
var Files embed.FS
