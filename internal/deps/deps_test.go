package deps

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/convlog/convlog"

// deps lists the packages pkg links (go list -deps, no tests).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// heavy are the prefixes a light import must never link.
var heavy = []string{
	"go.etcd.io/bbolt",
	"github.com/nats-io/",
	"github.com/labstack/echo",
	"github.com/jackc/pgx",
	"github.com/redis/go-redis",
	"gonum.org/",
}

func TestLightImports(t *testing.T) {
	for _, pkg := range []string{
		"worker",           // what an agent author imports
		"transport/client", // what a Go client user imports
		"transport/wire",
		"projection",
		"log/record",
		// the agent kinds and the conformance kit, for agent authors too
		"worker/agenttest",
		"worker/agentwire",
		"worker/httpagent",
		"worker/execagent",
		"worker/openaiagent",
		"internal/config",
	} {
		t.Run(pkg, func(t *testing.T) {
			for _, d := range deps(t, pkg) {
				for _, h := range heavy {
					if strings.HasPrefix(d, h) {
						t.Errorf("%s links %s", pkg, d)
					}
				}
			}
		})
	}
}

func TestProductBinaryLinksNoBenchDependencies(t *testing.T) {
	for _, d := range deps(t, "cmd/convlog") {
		for _, bad := range []string{"github.com/jackc/pgx", "github.com/redis/go-redis", "gonum.org/"} {
			if strings.HasPrefix(d, bad) {
				t.Errorf("cmd/convlog links %s", d)
			}
		}
	}
}

// Profiling is served only on the operator's --pprof-listen, never on the
// API's router: no package of ours but serve's pprof file imports it.
// (The embedded nats-server links net/http/pprof itself.)
func TestNoPackageOfOursServesProfiles(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == module+"/cmd/convlog" {
			continue
		}
		for _, imp := range f[1:] {
			if imp == "net/http/pprof" {
				t.Errorf("%s imports net/http/pprof", f[0])
			}
		}
	}
}

// The storage engine imports nothing of ours but its own record types.
func TestLogImportsNothingOfOurs(t *testing.T) {
	for _, d := range deps(t, "log") {
		if strings.HasPrefix(d, module+"/") && d != module+"/log" && d != module+"/log/record" {
			t.Errorf("log links %s", d)
		}
	}
}

// worker and transport build on log and projection, never on each other's
// internals: transport may use the light contract (worker) only, and the
// worker the light wire shapes (transport/wire, where the delta frame it
// publishes is defined) only.
func TestTransportAndWorkerApart(t *testing.T) {
	for _, d := range deps(t, "transport") {
		if strings.HasPrefix(d, module+"/worker/") {
			t.Errorf("transport links %s", d)
		}
	}
	for _, pkg := range []string{"worker/pool", "worker/natsbus"} {
		for _, d := range deps(t, pkg) {
			if strings.HasPrefix(d, module+"/transport") && d != module+"/transport/wire" {
				t.Errorf("%s links %s", pkg, d)
			}
		}
	}
}
