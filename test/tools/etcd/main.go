// Command etcd is upstream etcd's own entry point, built from the pinned
// go.etcd.io/etcd/server/v3 module (its root module carries replace
// directives, so it cannot be built directly with go build).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
