// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3),
// built at the version pinned in this module's go.mod/go.sum.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
