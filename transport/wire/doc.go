// Package wire holds the JSON shapes of convlog's HTTP API that a client
// and the server share: the delivery request and its 202, the error body
// and its codes, the frame types of a stream and the live delta frame
// (DeltaFrame, which the worker publishes and readers receive). It links
// no HTTP framework, no broker and no storage engine.
package wire
