package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// manifests are the YAML files of deploy/kubernetes, the directory above this module.
func manifests(t *testing.T) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join("..", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no manifests in deploy/kubernetes")
	}
	sort.Strings(found)
	return found
}

// kinds are the kinds every build of the manifests holds, one of each.
var kinds = []string{
	"v1 ConfigMap sessionstate-config",
	"v1 Service sessionstate",
	"apps/v1 Deployment sessionstate",
	"batch/v1 Job sessionstate-db-upgrade",
	"policy/v1 PodDisruptionBudget sessionstate",
	"networking.k8s.io/v1 NetworkPolicy sessionstate",
	"postgresql.cnpg.io/v1 Cluster sessionstate-db",
}

func TestEveryManifestDecodesStrictly(t *testing.T) {
	var seen []string
	for _, path := range manifests(t) {
		documents, err := check(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		for _, document := range documents {
			seen = append(seen, document.String())
		}
	}
	for _, kind := range append(kinds, "kustomize.config.k8s.io/v1beta1 Kustomization kustomization") {
		if count(seen, kind) != 1 {
			t.Errorf("the manifests hold %q %d times, not once: %v", kind, count(seen, kind), seen)
		}
	}
}

// The stream `kustomize build deploy/kubernetes` prints, the one `kubectl apply -k` sends,
// decodes strictly too. KUSTOMIZE names the binary (scripts/tools.sh kustomize).
func TestTheKustomizeBuildDecodesStrictly(t *testing.T) {
	binary := os.Getenv("KUSTOMIZE")
	if binary == "" {
		t.Fatal("set KUSTOMIZE to the kustomize binary (scripts/tools.sh kustomize)")
	}
	built, err := exec.Command(binary, "build", "..").Output()
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	documents, err := Decode(built)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, document := range documents {
		seen = append(seen, document.String())
		if deployment, ok := document.Object.(*appsv1.Deployment); ok {
			if deployment.Namespace != "sessionstate" {
				t.Errorf("the build puts the Deployment in %q", deployment.Namespace)
			}
		}
	}
	sort.Strings(seen)
	want := append([]string(nil), kinds...)
	sort.Strings(want)
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("the build holds\n%s\nnot\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: x
spec:
  %s
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: x
          image: x
`

const cluster = `apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  name: db
spec:
  %s
  storage:
    size: 1Gi
`

func TestWhatFailsTheCheck(t *testing.T) {
	for _, broken := range []struct{ name, stream, says string }{
		{"an unknown field", strings.Replace(deployment, "%s", "replica: 2", 1), `unknown field "spec.replica"`},
		{"a field spelt in another case", strings.Replace(deployment, "%s", "Replicas: 2", 1), `unknown field "spec.Replicas"`},
		{"a key twice", strings.Replace(deployment, "%s", "replicas: 2\n  replicas: 3", 1), `"replicas" already set`},
		{"a wrong type", strings.Replace(deployment, "%s", "replicas: two", 1), "cannot unmarshal string"},
		{"an unknown kind", "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n", "unknown kind v1 Secret"},
		{"no kind", "metadata: {name: x}\n", "no apiVersion or kind"},
		{"an unknown field beside a Cluster's spec", strings.Replace(strings.Replace(cluster, "%s", "instances: 3", 1), "spec:", "specs: {}\nspec:", 1), `unknown field "specs"`},
		{"an unknown field of a Cluster's metadata", strings.Replace(strings.Replace(cluster, "%s", "instances: 3", 1), "name: db", "name: db\n  label: {a: b}", 1), `unknown field "metadata.label"`},
	} {
		_, err := Decode([]byte(broken.stream))
		if err == nil {
			t.Errorf("%s: passed", broken.name)
		} else if !strings.Contains(err.Error(), broken.says) {
			t.Errorf("%s: %v (not %q)", broken.name, err, broken.says)
		}
	}
	if _, err := Decode([]byte(strings.Replace(cluster, "%s", "instances: 3", 1))); err != nil {
		t.Errorf("a valid Cluster: %v", err)
	}
}

func count(seen []string, kind string) int {
	n := 0
	for _, s := range seen {
		if s == kind {
			n++
		}
	}
	return n
}
