package main

import (
	"flag"
	"net/http"
	"os"
	"strings"

	"github.com/convlog/convlog/transport/client"
)

// defaultServer is the service the client verbs talk to when --server is
// not given: CONVLOG_SERVER, else the address `convlog serve` listens on by
// default.
func defaultServer() string {
	if s := os.Getenv("CONVLOG_SERVER"); s != "" {
		return s
	}
	return "http://127.0.0.1:8080"
}

// serverFlag adds --server to a verb's flags.
func serverFlag(fs *flag.FlagSet) *string {
	return fs.String("server", defaultServer(), "the convlog service's base URL (default $CONVLOG_SERVER or http://127.0.0.1:8080)")
}

// tokenTransport adds CONVLOG_TOKEN as a bearer token to every request.
// The service has no access control yet; the token is sent so that scripts
// written today keep working once it does.
type tokenTransport struct {
	token string
	next  http.RoundTripper
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(r)
}

// cliHTTP is the HTTP client of the verbs: no overall timeout (streams
// last), the token if one is set.
func cliHTTP() *http.Client {
	if tok := os.Getenv("CONVLOG_TOKEN"); tok != "" {
		return &http.Client{Transport: tokenTransport{token: tok, next: http.DefaultTransport}}
	}
	return http.DefaultClient
}

func cliClient(server string) *client.Client {
	if !strings.Contains(server, "://") {
		server = "http://" + server
	}
	return &client.Client{BaseURL: strings.TrimRight(server, "/"), HTTP: cliHTTP()}
}

// parseInterspersed parses flags that may come after positional arguments
// (`convlog send echo/demo "hi" --follow`), which the flag package alone
// stops at.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
