// Package auth decides who a caller is and what it may do: it verifies
// bearer tokens (static tokens stored as SHA-256 hashes, and JWTs signed
// with HS256, or RS256/ES256 keys from a JWKS file or URL that is re-read
// when a key it does not know appears), turns them into a Principal, and
// matches the principal's scopes against a verb on an agent instance.
//
// It knows nothing of HTTP routes: the HTTP layer maps each route to a
// Verb and a resource and asks Allows.
package auth
