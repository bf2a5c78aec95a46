#!/usr/bin/env bash
# Usage: scripts/tools.sh opa|regal|compose|litewitness|witnessctl|logcheck|kustomize
# Prints the path of the pinned tool, building it with `go install` into the
# project-local .tools/bin on first use. An `opa` already on PATH at the pinned
# version is used as it is. `compose` is Docker Compose v2, standalone, installed
# as .tools/bin/docker-compose: the tests run its `config` (no Docker engine needed).
# `litewitness` and `witnessctl` are filippo.io/torchwood's C2SP tlog-witness and its
# database tool, the witness the tests start; `logcheck` is examples/logcheck, the
# reviewer's checker built from the standard Go note and Merkle packages alone (its
# own go.mod pins them), rebuilt whenever its sources change. `kustomize` is
# sigs.k8s.io/kustomize, whose `build` the tests run on deploy/kubernetes (no cluster needed).
set -euo pipefail

OPA_VERSION=1.22.3
REGAL_VERSION=0.39.0
COMPOSE_VERSION=2.32.4
TORCHWOOD_VERSION=0.6.1
KUSTOMIZE_VERSION=5.8.2

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/.tools/bin"
export GOBIN="$bin" GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

# True when `BINARY version` prints a whole line matching the extended regex LINE.
# The output is captured before it is matched: `BINARY version | grep -q` under
# pipefail fails at random, since grep exits at its match and the tool, still
# writing, dies of SIGPIPE (which made tools.sh rebuild a tool it already had).
prints_version() { # binary, line
  local out
  [ -x "$1" ] || return 1
  out=$("$1" version 2>/dev/null) || return 1
  grep -Eq "^$2\$" <<<"$out"
}

pinned() { # version -> an extended regex matching exactly that version
  echo "${1//./\\.}"
}

# True when BINARY was built from MODULE at VERSION, as its build info says (`go
# version -m`; litewitness and witnessctl print no version of their own).
built_from() { # binary, module, version
  local out
  [ -x "$1" ] && command -v go >/dev/null || return 1
  out=$(go version -m "$1" 2>/dev/null) || return 1
  grep -Eq "^[[:space:]]+mod[[:space:]]+$2[[:space:]]+v$(pinned "$3")([[:space:]]|\$)" <<<"$out"
}

need_go() {
  command -v go >/dev/null || { echo "tools.sh: Go is needed to build $1 (https://go.dev/dl)" >&2; exit 1; }
}

case "${1:-}" in
  opa)
    opa_line="Version: +v?$(pinned "$OPA_VERSION")"
    if on_path=$(command -v opa) && prints_version "$on_path" "$opa_line"; then
      echo "$on_path"; exit 0
    fi
    if ! prints_version "$bin/opa" "$opa_line"; then
      need_go opa
      echo "tools.sh: building opa v$OPA_VERSION into .tools/bin (first use only)" >&2
      go install "github.com/open-policy-agent/opa@v$OPA_VERSION" >&2
    fi
    echo "$bin/opa"
    ;;
  regal)
    if ! prints_version "$bin/regal" "Version: +v?$(pinned "$REGAL_VERSION")"; then
      need_go regal
      echo "tools.sh: building regal v$REGAL_VERSION into .tools/bin (first use only)" >&2
      (cd "$root/scripts/regal" && go install \
        -ldflags "-X github.com/open-policy-agent/regal/pkg/version.Version=v$REGAL_VERSION" \
        github.com/open-policy-agent/regal) >&2
    fi
    echo "$bin/regal"
    ;;
  compose)
    if ! prints_version "$bin/docker-compose" "Docker Compose version v$(pinned "$COMPOSE_VERSION")"; then
      need_go compose
      echo "tools.sh: building docker compose v$COMPOSE_VERSION into .tools/bin (first use only, a few minutes)" >&2
      # go install names the binary after its package directory, `cmd`: build it
      # aside, then move it into place under the name it is known by.
      mkdir -p "$bin"
      build=$(mktemp -d "$bin/.compose.XXXXXX")
      trap 'rm -rf "$build"' EXIT
      GOBIN="$build" go install \
        -ldflags "-X github.com/docker/compose/v2/internal.Version=v$COMPOSE_VERSION" \
        "github.com/docker/compose/v2/cmd@v$COMPOSE_VERSION" >&2
      mv "$build/cmd" "$bin/docker-compose"
    fi
    echo "$bin/docker-compose"
    ;;
  litewitness|witnessctl)
    if ! built_from "$bin/$1" filippo.io/torchwood "$TORCHWOOD_VERSION"; then
      need_go "$1"
      echo "tools.sh: building $1 (torchwood v$TORCHWOOD_VERSION) into .tools/bin (first use only)" >&2
      go install "filippo.io/torchwood/cmd/$1@v$TORCHWOOD_VERSION" >&2
    fi
    echo "$bin/$1"
    ;;
  logcheck)
    src="$root/examples/logcheck"
    sum=$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum)
    if [ ! -x "$bin/logcheck" ] || [ "$(cat "$bin/logcheck.sum" 2>/dev/null)" != "$sum" ]; then
      need_go logcheck
      echo "tools.sh: building logcheck (examples/logcheck) into .tools/bin" >&2
      mkdir -p "$bin"
      build=$(mktemp -d "$bin/.logcheck.XXXXXX")
      trap 'rm -rf "$build"' EXIT
      (cd "$src" && go build -trimpath -o "$build/logcheck" .) >&2
      mv "$build/logcheck" "$bin/logcheck"
      echo "$sum" >"$bin/logcheck.sum"
    fi
    echo "$bin/logcheck"
    ;;
  kustomize)
    if ! built_from "$bin/kustomize" sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION"; then
      need_go kustomize
      echo "tools.sh: building kustomize v$KUSTOMIZE_VERSION into .tools/bin (first use only)" >&2
      go install "sigs.k8s.io/kustomize/kustomize/v5@v$KUSTOMIZE_VERSION" >&2
    fi
    echo "$bin/kustomize"
    ;;
  *)
    echo "usage: scripts/tools.sh opa|regal|compose|litewitness|witnessctl|logcheck|kustomize" >&2; exit 2 ;;
esac
