// Command etcd is etcd's own server entry point, built from go.etcd.io/etcd/server/v3 in a module of
// its own so that its dependency versions never disturb the Kubernetes build.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
