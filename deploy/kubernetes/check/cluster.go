package main

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	clusterAPIVersion = "postgresql.cnpg.io/v1"
	clusterKind       = "Cluster"
	// The CloudNativePG Cluster CRD as its project publishes it, unchanged:
	// https://github.com/cloudnative-pg/cloudnative-pg/blob/v1.30.0/config/crd/bases/postgresql.cnpg.io_clusters.yaml
	// (tag v1.30.0, commit 4b5e244a7d031f67e025c83c1555e7726ecbbfa1). The Go module of its
	// API types is not served by the Go module proxy, so the Cluster is checked against
	// this CRD's OpenAPI v3 schema, as the API server would prune and validate it.
	clusterCRDSHA256 = "ae47f4a00f6e998faef57e480f9a3960cd48ea16a79270861fc7442601507472"
)

//go:embed crd/postgresql.cnpg.io_clusters.yaml
var clusterCRD []byte

// schema is the part of an OpenAPI v3 schema (a CRD's structural schema) that says which
// fields an object may have and of which type. CEL rules (x-kubernetes-validations) and
// formats are not evaluated.
type schema struct {
	Type                 string             `json:"type"`
	Properties           map[string]*schema `json:"properties"`
	AdditionalProperties *additional        `json:"additionalProperties"`
	Items                *schema            `json:"items"`
	Required             []string           `json:"required"`
	Enum                 []any              `json:"enum"`
	Pattern              string             `json:"pattern"`
	Minimum              *float64           `json:"minimum"`
	Maximum              *float64           `json:"maximum"`
	MinLength            *int               `json:"minLength"`
	MaxLength            *int               `json:"maxLength"`
	MinItems             *int               `json:"minItems"`
	MaxItems             *int               `json:"maxItems"`
	Nullable             bool               `json:"nullable"`
	IntOrString          bool               `json:"x-kubernetes-int-or-string"`
	PreserveUnknown      bool               `json:"x-kubernetes-preserve-unknown-fields"`
}

// additional is additionalProperties: a schema for every value, or true/false.
type additional struct {
	Allowed bool
	Schema  *schema
}

func (a *additional) UnmarshalJSON(data []byte) error {
	if bytes.Equal(data, []byte("true")) || bytes.Equal(data, []byte("false")) {
		a.Allowed = bytes.Equal(data, []byte("true"))
		return nil
	}
	a.Allowed = true
	a.Schema = &schema{}
	return json.Unmarshal(data, a.Schema)
}

type crd struct {
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind string `json:"kind"`
		} `json:"names"`
		Versions []struct {
			Name   string `json:"name"`
			Served bool   `json:"served"`
			Schema struct {
				OpenAPIV3Schema *schema `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

var clusterSchema = sync.OnceValues(func() (*schema, error) {
	sum := sha256.Sum256(clusterCRD)
	if hex.EncodeToString(sum[:]) != clusterCRDSHA256 {
		return nil, errors.New("crd/postgresql.cnpg.io_clusters.yaml is not the CRD CloudNativePG v1.30.0 publishes (its sha256 differs)")
	}
	var definition crd
	if err := yaml.Unmarshal(clusterCRD, &definition); err != nil {
		return nil, fmt.Errorf("the Cluster CRD: %w", err)
	}
	for _, version := range definition.Spec.Versions {
		if definition.Spec.Group+"/"+version.Name == clusterAPIVersion && definition.Spec.Names.Kind == clusterKind && version.Served {
			return version.Schema.OpenAPIV3Schema, nil
		}
	}
	return nil, errors.New("the Cluster CRD serves no postgresql.cnpg.io/v1")
})

// decodeCluster checks a CloudNativePG Cluster: its metadata strictly into ObjectMeta,
// the rest against the CRD's schema, where a field the schema does not name is an error
// (the API server would drop it without a word, and the operator would never see it).
func decodeCluster(data []byte) (map[string]any, string, error) {
	root, err := clusterSchema()
	if err != nil {
		return nil, "", err
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	var object map[string]any
	if err := decoder.Decode(&object); err != nil {
		return nil, "", err
	}
	metadata, err := json.Marshal(object["metadata"])
	if err != nil {
		return nil, "", err
	}
	var meta metav1.ObjectMeta
	if err := strict(metadata, &meta); err != nil {
		return nil, "", fmt.Errorf("metadata: %w", err)
	}
	if meta.Name == "" {
		return nil, "", errors.New("no metadata.name")
	}
	rest := make(map[string]any, len(object))
	for key, value := range object {
		rest[key] = value
	}
	rest["metadata"] = map[string]any{} // the schema says only "object": checked above
	var problems []string
	root.validate("", rest, &problems)
	if len(problems) > 0 {
		return nil, "", errors.New(strings.Join(problems, "; "))
	}
	return object, meta.Name, nil
}

func (s *schema) validate(path string, value any, problems *[]string) {
	fail := func(format string, args ...any) {
		at := path
		if at == "" {
			at = "."
		}
		*problems = append(*problems, at+": "+fmt.Sprintf(format, args...))
	}
	if value == nil {
		if !s.Nullable {
			fail("null")
		}
		return
	}
	if s.IntOrString {
		switch v := value.(type) {
		case string:
		case json.Number:
			if _, err := v.Int64(); err != nil {
				fail("%s is neither an integer nor a string", v)
			}
		default:
			fail("neither an integer nor a string")
		}
		return
	}
	switch s.Type {
	case "object":
		object, ok := value.(map[string]any)
		if !ok {
			fail("not an object")
			return
		}
		s.validateObject(path, object, problems)
	case "array":
		list, ok := value.([]any)
		if !ok {
			fail("not an array")
			return
		}
		if s.MinItems != nil && len(list) < *s.MinItems {
			fail("fewer than %d items", *s.MinItems)
		}
		if s.MaxItems != nil && len(list) > *s.MaxItems {
			fail("more than %d items", *s.MaxItems)
		}
		if s.Items != nil {
			for index, item := range list {
				s.Items.validate(fmt.Sprintf("%s[%d]", path, index), item, problems)
			}
		}
	case "string":
		text, ok := value.(string)
		if !ok {
			fail("not a string")
			return
		}
		if s.MinLength != nil && len([]rune(text)) < *s.MinLength {
			fail("shorter than %d", *s.MinLength)
		}
		if s.MaxLength != nil && len([]rune(text)) > *s.MaxLength {
			fail("longer than %d", *s.MaxLength)
		}
		if s.Pattern != "" {
			pattern, err := regexp.Compile(s.Pattern)
			if err != nil {
				fail("the schema's pattern %q does not compile: %v", s.Pattern, err)
			} else if !pattern.MatchString(text) {
				fail("%q does not match %q", text, s.Pattern)
			}
		}
		s.validateEnum(value, fail)
	case "integer", "number":
		number, ok := value.(json.Number)
		if !ok {
			fail("not a number")
			return
		}
		if s.Type == "integer" {
			if _, err := number.Int64(); err != nil {
				fail("%s is not an integer", number)
				return
			}
		}
		figure, _ := number.Float64()
		if s.Minimum != nil && figure < *s.Minimum {
			fail("%s is below %v", number, *s.Minimum)
		}
		if s.Maximum != nil && figure > *s.Maximum {
			fail("%s is above %v", number, *s.Maximum)
		}
		s.validateEnum(value, fail)
	case "boolean":
		if _, ok := value.(bool); !ok {
			fail("not a boolean")
		}
	case "":
		if !s.PreserveUnknown {
			fail("the schema gives this field no type")
		}
	default:
		fail("the schema's type %q is not one this check knows", s.Type)
	}
}

func (s *schema) validateObject(path string, object map[string]any, problems *[]string) {
	keys := make([]string, 0, len(object))
	for key := range object {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		at := path + "." + key
		if field, ok := s.Properties[key]; ok {
			field.validate(at, object[key], problems)
			continue
		}
		switch {
		case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
			s.AdditionalProperties.Schema.validate(at, object[key], problems)
		case s.AdditionalProperties != nil && s.AdditionalProperties.Allowed, s.PreserveUnknown:
		default:
			*problems = append(*problems, at+": unknown field")
		}
	}
	for _, name := range s.Required {
		if _, ok := object[name]; !ok {
			*problems = append(*problems, path+"."+name+": required")
		}
	}
}

func (s *schema) validateEnum(value any, fail func(string, ...any)) {
	if len(s.Enum) == 0 {
		return
	}
	given := fmt.Sprint(value)
	for _, allowed := range s.Enum {
		if fmt.Sprint(allowed) == given {
			return
		}
	}
	fail("%v is not one of %v", value, s.Enum)
}
