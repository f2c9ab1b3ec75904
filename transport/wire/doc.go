// Package wire holds the JSON shapes of convlog's HTTP API that a client
// and the server share: the delivery request and its 202, the error body
// and its codes, and the frame types of a stream. It links no HTTP
// framework and no storage engine.
package wire
