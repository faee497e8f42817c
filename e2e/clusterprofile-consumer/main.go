// Command clusterprofile-consumer does what a ClusterProfile consumer does, with upstream code
// only: it lists the ClusterProfiles of one namespace with cluster-inventory-api's clientset,
// builds a rest.Config from each with cluster-inventory-api's pkg/access (NewFromFile and
// BuildConfigFromCP, with the provider file the caller gives), and lists that cluster's nodes
// with client-go. It prints {"<profile>": {"nodes": [...]} or {"error": "..."}} as JSON.
//
// The Tether tests run it against the ClusterProfiles the leader publishes
// (e2e/tests/inventory.rs), with `tether credential` as the provider's exec plugin.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
)

type result struct {
	Nodes []string `json:"nodes,omitempty"`
	Error string   `json:"error,omitempty"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster holding the ClusterProfiles (the leader)")
	namespace := flag.String("namespace", "", "the inventory namespace to read ClusterProfiles from")
	providerFile := access.SetupProviderFileFlag()
	flag.Parse()
	if err := run(*kubeconfig, *namespace, *providerFile); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, providerFile string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	inventory, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	profiles, err := inventory.ApisV1alpha1().ClusterProfiles(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ClusterProfiles in %s: %w", namespace, err)
	}
	providers, err := access.NewFromFile(providerFile)
	if err != nil {
		return err
	}
	out := map[string]result{}
	for i := range profiles.Items {
		cp := &profiles.Items[i]
		out[cp.Name] = nodesOf(ctx, providers, cp)
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

func nodesOf(ctx context.Context, providers *access.Config, cp *v1alpha1.ClusterProfile) result {
	rc, err := providers.BuildConfigFromCP(cp)
	if err != nil {
		return result{Error: err.Error()}
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return result{Error: err.Error()}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return result{Error: err.Error()}
	}
	names := []string{}
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	sort.Strings(names)
	return result{Nodes: names}
}
