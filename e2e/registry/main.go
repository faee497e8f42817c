// Command registry is distribution's registry (github.com/distribution/distribution/v3) with
// only the storage the node tier uses: the filesystem and in-memory drivers. Upstream's
// cmd/registry also links the Azure, GCS, S3 and CloudFront SDKs, which made it the slowest
// program of `make tools` to compile on a new machine; the server is the same code.
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// NB: as upstream's main: the two commands RootCmd registers exit non-zero themselves.
	_ = registry.RootCmd.Execute()
}
