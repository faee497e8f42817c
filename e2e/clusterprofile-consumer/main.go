// Command clusterprofile-consumer does what a ClusterProfile consumer does, with upstream code
// only: it lists the ClusterProfiles of one namespace with cluster-inventory-api's clientset,
// builds a rest.Config from each with cluster-inventory-api's pkg/access (NewFromFile and
// BuildConfigFromCP, with the provider file the caller gives), and lists that cluster's nodes
// with client-go. It prints {"<profile>": {"nodes": [...]} or {"error": "..."}} as JSON.
//
// With --write-kubeconfigs DIR it also writes each rest.Config pkg/access built as
// DIR/<profile>.kubeconfig (server, CA, exec plugin and the cluster's exec extension), for
// e2e/multicluster-consumer: multicluster-runtime's newest release the Go module proxy serves
// (v0.22.4-beta.1) does not build against the controller-runtime cluster-inventory-api v0.1.x
// requires (v0.23.3), and its own cluster-inventory-api provider module is not served.
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
	"path/filepath"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
	writeTo := flag.String("write-kubeconfigs", "", "also write each profile's rest.Config as a kubeconfig into this directory")
	providerFile := access.SetupProviderFileFlag()
	flag.Parse()
	if err := run(*kubeconfig, *namespace, *providerFile, *writeTo); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, providerFile, writeTo string) error {
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
		if writeTo != "" {
			if err := writeKubeconfig(providers, cp, filepath.Join(writeTo, cp.Name+".kubeconfig")); err != nil {
				return err
			}
		}
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// writeKubeconfig writes the rest.Config pkg/access builds for cp as a kubeconfig at path.
func writeKubeconfig(providers *access.Config, cp *v1alpha1.ClusterProfile, path string) error {
	rc, err := providers.BuildConfigFromCP(cp)
	if err != nil {
		return err
	}
	cluster := clientcmdapi.NewCluster()
	cluster.Server = rc.Host
	cluster.CertificateAuthorityData = rc.CAData
	if rc.ExecProvider.Config != nil {
		cluster.Extensions[execExtension] = rc.ExecProvider.Config
	}
	user := clientcmdapi.NewAuthInfo()
	exec := *rc.ExecProvider
	exec.Config = nil
	user.Exec = &exec
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cp.Name] = cluster
	cfg.AuthInfos[cp.Name] = user
	cfg.Contexts[cp.Name] = &clientcmdapi.Context{Cluster: cp.Name, AuthInfo: cp.Name}
	cfg.CurrentContext = cp.Name
	return clientcmd.WriteToFile(*cfg, path)
}

const execExtension = "client.authentication.k8s.io/exec"

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
