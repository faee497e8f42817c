// Command multicluster-consumer runs a small multi-cluster reconciler with multicluster-runtime
// (its manager, builder and in-tree `clusters` provider) over the member clusters named by the
// kubeconfigs in a directory (written by clusterprofile-consumer from the ClusterProfiles Tether
// publishes, through cluster-inventory-api's pkg/access). It prints one line
// `seen <cluster> <namespace>/<name>` the first time it reconciles the ConfigMap --name in each
// cluster, and exits 0 once it saw it in every cluster (1 after --timeout).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/providers/clusters"
)

func main() {
	dir := flag.String("kubeconfigs", "", "directory of <cluster>.kubeconfig files")
	local := flag.String("kubeconfig", "", "kubeconfig of the cluster the manager itself runs against (the leader)")
	name := flag.String("name", "", "the ConfigMap name to look for in every cluster")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	if err := run(*dir, *local, *name, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(dir, local, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	files, err := filepath.Glob(filepath.Join(dir, "*.kubeconfig"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no kubeconfigs in %s", dir)
	}
	localCfg, err := clientcmd.BuildConfigFromFlags("", local)
	if err != nil {
		return err
	}
	provider := clusters.New()
	want := map[string]bool{}
	for _, f := range files {
		clusterName := strings.TrimSuffix(filepath.Base(f), ".kubeconfig")
		cfg, err := clientcmd.BuildConfigFromFlags("", f)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		cl, err := cluster.New(cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", clusterName, err)
		}
		if err := provider.Add(ctx, clusterName, cl); err != nil {
			return err
		}
		want[clusterName] = true
	}
	mgr, err := mcmanager.New(localCfg, provider, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return err
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	done := make(chan struct{})
	err = mcbuilder.ControllerManagedBy(mgr).
		Named("tether-probe").
		For(&corev1.ConfigMap{}).
		Complete(mcreconcile.Func(func(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
			if req.Name != name {
				return reconcile.Result{}, nil
			}
			mu.Lock()
			defer mu.Unlock()
			if !seen[req.ClusterName] {
				seen[req.ClusterName] = true
				fmt.Printf("seen %s %s/%s\n", req.ClusterName, req.Namespace, req.Name)
				if len(seen) == len(want) {
					close(done)
				}
			}
			return reconcile.Result{}, nil
		}))
	if err != nil {
		return err
	}
	// NB: the manager starts the provider (a ProviderRunnable) itself.
	errs := make(chan error, 1)
	go func() { errs <- mgr.Start(ctx) }()
	select {
	case <-done:
		return nil
	case err := <-errs:
		if err != nil {
			return err
		}
		<-ctx.Done()
		return fmt.Errorf("saw %v of %v before the timeout", seen, want)
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("saw %v of %v before the timeout", seen, want)
	}
}
