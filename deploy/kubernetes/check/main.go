// Command k8scheck decodes every YAML document of the Kubernetes manifests it is given
// strictly, each into the k8s.io/api type of its kind (of a CloudNativePG Cluster, its
// envelope and metadata): an unknown field, a field spelt in another case,
// a key given twice or a kind the manifests may not hold fails it. `-` reads standard
// input (`kustomize build deploy/kubernetes | k8scheck -`).
//
// Usage: k8scheck FILE|- ...
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: k8scheck FILE|- ...")
		os.Exit(2)
	}
	failed := false
	for _, name := range os.Args[1:] {
		documents, err := check(name)
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", name, err)
			failed = true
			continue
		}
		for _, document := range documents {
			fmt.Printf("ok %s: %s\n", name, document)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func check(name string) ([]Document, error) {
	var stream []byte
	var err error
	if name == "-" {
		stream, err = io.ReadAll(os.Stdin)
	} else {
		stream, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, err
	}
	return Decode(stream)
}
