package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	kustomize "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

// Document is one YAML document of a manifest, as decoded.
type Document struct {
	APIVersion string
	Kind       string
	Name       string
	// Object is the typed value the document decoded into (*appsv1.Deployment, ...), or,
	// for the CloudNativePG Cluster, its envelope (*clusterDocument).
	Object any
}

func (d Document) String() string {
	return fmt.Sprintf("%s %s %s", d.APIVersion, d.Kind, d.Name)
}

// typed are the kinds the manifests may hold, each with the k8s.io/api type it must
// decode into. Any other kind fails.
var typed = map[string]func() any{
	"v1/ConfigMap":                       func() any { return &corev1.ConfigMap{} },
	"v1/Service":                         func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                 func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                       func() any { return &batchv1.Job{} },
	"policy/v1/PodDisruptionBudget":      func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingv1.NetworkPolicy{} },
	// kustomization.yaml itself, into kustomize's own type (kustomize build refuses an
	// unknown field of it too, but spelt in another case it takes it).
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return &kustomize.Kustomization{} },
}

const (
	clusterAPIVersion = "postgresql.cnpg.io/v1"
	clusterKind       = "Cluster"
)

// clusterDocument is what is checked of a CloudNativePG Cluster: its envelope and its
// metadata strictly; its spec only for being an object. CloudNativePG's Go API types are
// not served by the Go module proxy this project builds from, so the spec's fields are
// not checked here (docs/deployment.md says so).
type clusterDocument struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              map[string]any `json:"spec"`
}

// Decode splits a YAML stream into its documents and decodes each strictly: by its
// apiVersion and kind into the k8s.io/api type (every field known to that type, spelt
// as it spells it, no key twice), or, for a CloudNativePG Cluster, its envelope and
// metadata (`clusterDocument`). Empty documents are skipped; an unknown kind is an error.
func Decode(stream []byte) ([]Document, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var documents []Document
	for index := 0; ; index++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return documents, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", index, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		document, err := decodeOne(raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", index, err)
		}
		documents = append(documents, document)
	}
}

func decodeOne(raw []byte) (Document, error) {
	data, err := yaml.YAMLToJSONStrict(raw) // a key given twice fails here
	if err != nil {
		return Document{}, err
	}
	var meta metav1.TypeMeta
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &meta); err != nil {
		return Document{}, err
	}
	if meta.APIVersion == "" || meta.Kind == "" {
		return Document{}, errors.New("no apiVersion or kind")
	}
	document := Document{APIVersion: meta.APIVersion, Kind: meta.Kind}
	make, ok := typed[meta.APIVersion+"/"+meta.Kind]
	if meta.APIVersion == clusterAPIVersion && meta.Kind == clusterKind {
		make, ok = func() any { return &clusterDocument{} }, true
	}
	if !ok {
		return Document{}, fmt.Errorf("unknown kind %s %s: not one the manifests may hold", meta.APIVersion, meta.Kind)
	}
	object := make()
	if err := strict(data, object); err != nil {
		return Document{}, fmt.Errorf("%s %s: %w", meta.APIVersion, meta.Kind, err)
	}
	if kustomization, ok := object.(*kustomize.Kustomization); ok {
		document.Object, document.Name = object, "kustomization"
		if len(kustomization.Resources) == 0 {
			return Document{}, errors.New("a Kustomization without resources")
		}
		return document, nil
	}
	accessor, ok := object.(metav1.Object)
	if !ok {
		return Document{}, fmt.Errorf("%s %s has no metadata", meta.APIVersion, meta.Kind)
	}
	if accessor.GetName() == "" {
		return Document{}, fmt.Errorf("%s %s: no metadata.name", meta.APIVersion, meta.Kind)
	}
	document.Object, document.Name = object, accessor.GetName()
	return document, nil
}

// strict decodes JSON into object as the API server's strict field validation does:
// case-sensitive field names, and an unknown or duplicated field is an error.
func strict(data []byte, object any) error {
	strictErrors, err := sigsjson.UnmarshalStrict(data, object) // every strict check: unknown and duplicate fields
	if err != nil {
		return err
	}
	if len(strictErrors) > 0 {
		return errors.Join(strictErrors...)
	}
	return nil
}

// stripComments drops the lines that hold only a YAML comment (a document of comments
// alone is empty).
func stripComments(raw []byte) []byte {
	var kept [][]byte
	for _, line := range bytes.Split(raw, []byte("\n")) {
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) == 0 || trimmed[0] == '#' || bytes.Equal(trimmed, []byte("---")) {
			continue
		}
		kept = append(kept, line)
	}
	return bytes.Join(kept, []byte("\n"))
}
