#!/usr/bin/env bash
# The dependency lock. uv.lock pins every package of pyproject.toml's dependencies and
# of its `dev` and `bench` extras, with the hash of every file; requirements/runtime.txt (the
# image, an install from a wheel) and requirements/dev.txt (`make install`: dev and bench)
# are its exports for pip's --require-hashes mode. docs/operators.md, "Locked dependencies".
#
#   scripts/lock.sh check     exit 1 when pyproject.toml, uv.lock and the exports disagree
#                             (offline: nothing is asked of the package index)
#   scripts/lock.sh update    re-resolve after a pyproject.toml change and rewrite the
#                             exports (asks the index); more arguments go to `uv lock`,
#                             e.g. --upgrade or --upgrade-package flask
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}

exported() {  # the lock as requirements for pip, without the project itself
  "$UV" export --quiet --frozen --no-emit-project --no-header --format requirements-txt "$@"
}
runtime() { exported; }
dev() { exported --extra dev --extra bench; }

case "${1:-}" in
  check)
    if ! "$UV" lock --quiet --check --offline; then
      echo "uv.lock does not match pyproject.toml: run scripts/lock.sh update" >&2
      exit 1
    fi
    if ! diff -u requirements/runtime.txt <(runtime) || ! diff -u requirements/dev.txt <(dev); then
      echo "requirements/*.txt are not uv.lock's exports: run scripts/lock.sh update" >&2
      exit 1
    fi
    ;;
  update)
    shift
    "$UV" lock "$@"
    runtime >requirements/runtime.txt
    dev >requirements/dev.txt
    ;;
  *)
    echo "usage: scripts/lock.sh check | update [uv lock arguments]" >&2
    exit 2
    ;;
esac
