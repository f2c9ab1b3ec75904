package wire

// Error codes of input that would be altered if stored, of requests that
// are not valid HTTP, and of the server's limits (see docs/protocol.md,
// section 5). The 503s come with Retry-After.
const (
	CodeInvalidUTF8                 = "invalid_utf8"                  // 400: bytes that are not UTF-8, or a lone \uD800–\uDFFF escape
	CodeDuplicateKey                = "duplicate_key"                 // 400: an object with the same key twice
	CodeNumberOutOfRange            = "number_out_of_range"           // 400: a number beyond the range of a 64-bit float
	CodeMalformedRequest            = "malformed_request"             // 400: a request that is not valid HTTP, or a malformed query
	CodeUnsupportedTransferEncoding = "unsupported_transfer_encoding" // 400: a Transfer-Encoding other than chunked
	CodeRequestTimeout              = "request_timeout"               // 408: the body did not arrive within the body read timeout
	CodeHeadersTooLarge             = "headers_too_large"             // 431: request headers over the limit
	CodeOverloaded                  = "overloaded"                    // 503: the in-flight budget of bodies or pages is spent
	CodeTooManyStreams              = "too_many_streams"              // 503: the server's stream cap is reached
)
