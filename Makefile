# The two commands a newcomer needs: `make run` and `make test`.
# Everything else here is what those two are made of.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
POLICIES := policies
SCHEMAS := policies/schemas

.PHONY: help run test install tools browser wrk postgres patroni openssh schema pgbouncer lint-py types lint-rego test-rego test-py test-quick bench clean policy-manifest lock lock-check api-doc

help:
	@echo "make run    start the OPA sidecar and the service on 127.0.0.1:8080"
	@echo "make test   the whole suite: Rego fmt/check/lint/tests, Python lint/types/tests"
	@echo "make test-quick  the Python suite without the slowest end-to-end cases (marked slow)"
	@echo "make bench  benchmarks (bench/), figures against same-run baselines"

# The locked versions (requirements/dev.txt, exported from uv.lock, every file's hash
# checked), then the project itself, editable, with no dependency of its own resolved,
# and the client distribution (sessionstate_client, clients/python), editable too.
$(STAMP): pyproject.toml setup.py requirements/dev.txt clients/python/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e clients/python
	@touch $@

install: $(STAMP)

# The lock must match pyproject.toml: `uv lock --check --offline` and the exports
# compared (scripts/lock.sh; no index is asked). After a dependency change, `make lock`
# re-resolves (that asks the index); docs/operators.md, "Locked dependencies".
lock-check: install
	scripts/lock.sh check

lock: install
	scripts/lock.sh update

# Pinned OPA, Regal and Docker Compose, built with `go install` into .tools/bin on first
# use (Compose, for tests/runtime/test_deployment.py's `docker-compose config`: about 2 minutes);
# torchwood's litewitness and witnessctl (the witness the tests start), and logcheck
# (examples/logcheck, the reviewer's checker), which the decision log's tests run; and
# kustomize, whose `build` of deploy/kubernetes tests/runtime/test_kubernetes_manifests.py runs.
tools:
	@scripts/tools.sh opa >/dev/null
	@scripts/tools.sh regal >/dev/null
	@scripts/tools.sh compose >/dev/null
	@scripts/tools.sh litewitness >/dev/null
	@scripts/tools.sh witnessctl >/dev/null
	@scripts/tools.sh logcheck >/dev/null
	@scripts/tools.sh kustomize >/dev/null

# Debian's Chromium for the reviewer page's browser test (Playwright drives it; it never
# downloads a browser of its own). Installed unattended when we are root, as in CI.
CHROMIUM := /usr/bin/chromium
browser:
	@scripts/need_debian_package.sh chromium $(CHROMIUM)

# wrk drives HTTP load in bench/ (the client's CPU must not dominate); Debian's package.
WRK := /usr/bin/wrk
wrk:
	@scripts/need_debian_package.sh wrk $(WRK)

# Debian's openssh-client: litewitness keeps its key in an ssh-agent, which the witness
# tests start with ssh-keygen and ssh-add (tests/support/witness.py).
SSH_AGENT := /usr/bin/ssh-agent
openssh:
	@scripts/need_debian_package.sh openssh-client $(SSH_AGENT)

# Debian's PostgreSQL (15 on Debian 12) for the PostgreSQL store's tests: tests/support/postgres.py
# starts servers of its own in temporary directories, as a system user of its own.
postgres:
	@scripts/need_debian_package.sh postgresql '/usr/lib/postgresql/*/bin/initdb'

# Debian's PgBouncer, in front of PostgreSQL in transaction pooling: tests/support/pgbouncer.py
pgbouncer:
	@scripts/need_debian_package.sh pgbouncer /usr/sbin/pgbouncer

# Debian's Patroni (3.0; it pulls python3-etcd, and runs as the system python3, not the venv),
# etcd (3.4) and HAProxy for the automatic failover tests: tests/support/patroni.py starts an
# etcd member, two Patroni nodes and HAProxy of its own on 127.0.0.1, in a temporary directory.
patroni: postgres
	@scripts/need_debian_package.sh patroni /usr/bin/patroni
	@scripts/need_debian_package.sh etcd-server /usr/bin/etcd
	@scripts/need_debian_package.sh haproxy /usr/sbin/haproxy

# The OPA input schema is generated from service/policy/input.py, the tenant settings
# document's (data.sessionstate.tenants) from service/policy/tenant_settings.py.
schema: install
	$(PY) -m service.policy.input > $(SCHEMAS)/policy_input.json
	$(PY) -m service.policy.tenant_settings > $(SCHEMAS)/tenants/settings.json

# docs/api.md's tables (endpoints, reason codes, shapes, settings) are written from the
# code; tests/api/test_api_doc.py fails while one is stale.
api-doc: install
	$(PY) scripts/api_doc.py

# After a policy edit: the bundle manifest's revision is the policies' content hash.
policy-manifest: install
	$(PY) deploy/policy_manifest.py --commit

# Starts OPA and the service on 127.0.0.1:8080 (data in ./var), then prints a walk-through.
run: install
	@SESSIONSTATE_OPA_BIN=$${SESSIONSTATE_OPA_BIN:-$$(scripts/tools.sh opa)} $(VENV)/bin/sessionstate serve --walkthrough

lint-py: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: install
	$(VENV)/bin/mypy

lint-rego: tools install
	@opa=$$(scripts/tools.sh opa); regal=$$(scripts/tools.sh regal); set -x; \
	$$opa fmt --list --fail $(POLICIES) && \
	$$opa check --strict --schema $(SCHEMAS) $(POLICIES) && \
	$$regal lint $(POLICIES) && \
	$(PY) deploy/policy_manifest.py --check

test-rego: tools install
	@opa=$$(scripts/tools.sh opa); set -x; \
	$$opa test $(POLICIES) && \
	$$opa test --coverage --format json $(POLICIES) | $(PY) scripts/rego_coverage.py

# Three pytest workers (pytest-xdist) on two cores: most tests wait on real servers and timeouts.
PYTEST_WORKERS ?= 3
test-py: install tools browser wrk postgres pgbouncer patroni openssh
	SESSIONSTATE_OPA_BIN=$$(scripts/tools.sh opa) $(VENV)/bin/pytest -n $(PYTEST_WORKERS)

test: lock-check lint-rego test-rego lint-py types test-py

# The Python suite without the cases marked slow (the longest end-to-end ones), for a quick
# loop while working; `make test` runs them all.
test-quick: install tools browser wrk postgres pgbouncer patroni openssh
	SESSIONSTATE_OPA_BIN=$$(scripts/tools.sh opa) $(VENV)/bin/pytest -n $(PYTEST_WORKERS) -m "not slow"

# postgres: bench/peer_bench.py starts a throwaway PostgreSQL (tests/support/postgres.py).
bench: install tools wrk postgres
	@for script in bench/*_bench.py; do \
	  echo "== $$script"; SESSIONSTATE_OPA_BIN=$$(scripts/tools.sh opa) $(PY) $$script || exit 1; \
	done

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis var
