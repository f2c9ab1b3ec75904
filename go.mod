module github.com/convlog/convlog

go 1.26.8

require (
	github.com/oklog/ulid/v2 v2.1.2
	go.etcd.io/bbolt v1.5.0
)

require (
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
