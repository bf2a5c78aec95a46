//go:build tools

// Package tools pins Regal and every module it builds with (go.sum). `go install
// regal@version` is not used: it first reads the module's version list, which
// the module proxy here refuses, while exact versions are served.
package tools

import _ "github.com/open-policy-agent/regal"
