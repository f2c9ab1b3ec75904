package transport

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPI is the OpenAPI 3.1 document of every route; TestOpenAPICoversRoutes
// keeps it in step with the routes registered, and a real validator checks
// it (transport/testdata/openapi).
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI is the OpenAPI 3.1 document the server serves at /openapi.json.
func OpenAPI() []byte { return openAPI }

func (s *Server) openapi(c echo.Context) error {
	c.Response().Header().Set(echo.HeaderCacheControl, "no-cache")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
}

// Route is one route the server registers, in echo's form
// (/agents/:name/:instanceId).
type Route struct{ Method, Path string }

// Routes lists the routes registered, for the documentation's tests.
func (s *Server) Routes() []Route {
	var out []Route
	for _, r := range s.echo.Routes() {
		out = append(out, Route{r.Method, r.Path})
	}
	return out
}
