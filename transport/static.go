package transport

import (
	"cmp"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/convlog/convlog/transport/console"
	"github.com/convlog/convlog/transport/jsclient"
	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// Static files are embedded in the binary: the web console at /console and
// the JS client it runs on at /client/. Nothing is built at run time.
const (
	ConsolePath = "/console"
	ClientPath  = "/client/"
)

// staticTypes are set by hand: the platform's MIME table varies by machine
// (a module script served as text/plain is refused by browsers), and ".ts"
// is commonly MPEG transport stream.
var staticTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".json": "application/json",
	".ts":   "text/plain; charset=utf-8",
	".png":  "image/png",
	".svg":  "image/svg+xml",
}

func (s *Server) registerStatic(e *echo.Echo) {
	consoleFiles := serveFS(console.Files, "index.html")
	e.GET(ConsolePath, consoleFiles)
	e.GET(ConsolePath+"/routes.json", s.consoleRoutes)
	e.GET(ConsolePath+"/*", consoleFiles)
	e.GET(ClientPath+"*", serveFS(jsclient.Files, ""))
}

// serveFS serves the file named by the route's wildcard, index for none.
// Unknown files are the API's JSON 404, like any unknown route.
func serveFS(files fs.FS, index string) echo.HandlerFunc {
	return func(c echo.Context) error {
		name := strings.TrimPrefix(path.Clean("/"+c.Param("*")), "/")
		if name == "" {
			name = index
		}
		b, err := fs.ReadFile(files, name)
		if err != nil || name == "" {
			return apiErr(http.StatusNotFound, wire.CodeNotFound, "no such file %q", c.Request().URL.Path)
		}
		h := c.Response().Header()
		ct, ok := staticTypes[path.Ext(name)]
		if !ok {
			ct = "application/octet-stream"
		}
		h.Set(echo.HeaderContentType, ct)
		// Revalidate every time: the files change with the binary, and a
		// stale client module next to a new console would break both.
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		return c.Blob(http.StatusOK, ct, b)
	}
}

// consoleRoutes lists every route the server registers, so that the
// console shows the buttons and listings of the routes this binary has
// (rewind, fork, listings...) without probing for them.
func (s *Server) consoleRoutes(c echo.Context) error {
	type route struct {
		Method string `json:"method"`
		Path   string `json:"path"`
	}
	out := []route{}
	for _, r := range s.echo.Routes() {
		out = append(out, route{r.Method, r.Path})
	}
	slices.SortFunc(out, func(a, b route) int { return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Method, b.Method)) })
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, map[string]any{"routes": out})
}
