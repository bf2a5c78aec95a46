#!/usr/bin/env bash
# Usage: scripts/need_debian_package.sh PACKAGE PATH...
# Exits 0 when any PATH (a glob is fine) exists. Otherwise installs Debian's PACKAGE,
# unattended, when run as root (as in CI), or says how to and exits 1.
set -euo pipefail
package=$1; shift
for path in "$@"; do
  if compgen -G "$path" >/dev/null; then exit 0; fi
done
if [ "$(id -u)" = 0 ]; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "$package"
else
  echo "$package is missing; install Debian's $package:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y $package" >&2
  exit 1
fi
