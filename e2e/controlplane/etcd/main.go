// Command etcd is the upstream etcd server, built from the Go module proxy so that the test
// control plane needs no other source. One etcd serves every Kubernetes version the tests run.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
