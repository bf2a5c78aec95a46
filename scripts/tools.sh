#!/usr/bin/env bash
# Usage: scripts/tools.sh opa|regal
# Prints the path of the pinned tool, building it with `go install` into the
# project-local .tools/bin on first use. An `opa` already on PATH at the pinned
# version is used as it is.
set -euo pipefail

OPA_VERSION=1.22.3
REGAL_VERSION=0.39.0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/.tools/bin"
export GOBIN="$bin" GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

has_version() { # binary, version
  [ -x "$1" ] && "$1" version 2>/dev/null | grep -Eq "^Version: +v?$2\$"
}

need_go() {
  command -v go >/dev/null || { echo "tools.sh: Go is needed to build $1 (https://go.dev/dl)" >&2; exit 1; }
}

case "${1:-}" in
  opa)
    if on_path=$(command -v opa) && has_version "$on_path" "$OPA_VERSION"; then
      echo "$on_path"; exit 0
    fi
    if ! has_version "$bin/opa" "$OPA_VERSION"; then
      need_go opa
      echo "tools.sh: building opa v$OPA_VERSION into .tools/bin (first use only)" >&2
      go install "github.com/open-policy-agent/opa@v$OPA_VERSION" >&2
    fi
    echo "$bin/opa"
    ;;
  regal)
    if ! has_version "$bin/regal" "$REGAL_VERSION"; then
      need_go regal
      echo "tools.sh: building regal v$REGAL_VERSION into .tools/bin (first use only)" >&2
      (cd "$root/scripts/regal" && go install \
        -ldflags "-X github.com/open-policy-agent/regal/pkg/version.Version=v$REGAL_VERSION" \
        github.com/open-policy-agent/regal) >&2
    fi
    echo "$bin/regal"
    ;;
  *)
    echo "usage: scripts/tools.sh opa|regal" >&2; exit 2 ;;
esac
