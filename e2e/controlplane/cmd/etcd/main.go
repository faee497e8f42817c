// Command etcd is the upstream etcd server, built from the same module graph as
// kube-apiserver so that the test control plane needs no other source.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
