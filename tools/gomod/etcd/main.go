// Command etcd is etcd's server built from the go.etcd.io/etcd/server/v3 module: that module
// cannot be `go install`ed directly (its go.mod has replace directives), so this wrapper module
// pins it and calls the same entry point as etcd's own main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
