# stackflow's one dev entry point. `make demo` and `make test` are the README's two commands.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python

.PHONY: help setup up down status env demo test test-compat test-server test-unit lint typecheck bench docs

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: ## install everything (Debian packages, venv, Temporal CLI, kube control plane, OpenTofu)
	@scripts/setup.sh

up: setup ## start Temporal dev server, Redis, etcd, kube-apiserver, kube-controller-manager, worker
	@scripts/services.sh up

down: ## stop every service started by `make up`
	@scripts/services.sh down

status: ## report each service: healthy, unhealthy or stopped
	@scripts/services.sh status

env: ## print export lines: eval "$$(make -s env)"
	@scripts/services.sh env

# The demo needs only Temporal, the state backend, Redis, the codec, a worker and the API: it
# builds and starts only those (`make up` and `make test` build and start the rest).
DEMO_SERVICES := postgres redis codec temporal worker api
demo: ## set up and start only what the demo needs, apply examples/onprem.yaml, list the releases
	@scripts/setup.sh demo && scripts/services.sh up $(DEMO_SERVICES) && scripts/demo.sh

# The suite mostly waits on the services: two pytest processes (pytest-xdist) take a test file
# each at a time; then the tests marked `serial` (they stop a service the others share), alone.
TEST_JOBS ?= 2
test: up docs ## build the docs, then run the whole test suite against the real services
	@eval "$$(scripts/services.sh env)" && \
	  $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not serial" tests && \
	  $(PY) -m pytest -q -m serial tests

# The Kubernetes integration tests on the oldest supported minor (KUBE_COMPAT, default 1.35):
# builds that control plane once (its own cache dir), restarts the dev cluster's kube services on
# it (their own etcd data), and leaves them there; `make up` goes back to the default minor.
KUBE_COMPAT ?= 1.35
test-compat: setup ## Kubernetes integration tests on the oldest supported minor, 1.35 (not in `make test`)
	@export STACKFLOW_KUBE_VERSION=$(KUBE_COMPAT) && scripts/setup.sh kubernetes && scripts/services.sh up && \
	  eval "$$(scripts/services.sh env)" && $(PY) -m pytest -q tests/integration/test_kubernetes_*.py

# The multi-worker and crash tests against the Temporal server proper on PostgreSQL
# (STACKFLOW_TEMPORAL_MODE=server: builds it once, restarts the `temporal` service as that server,
# and leaves it there; a plain `make up` goes back to the dev server), with the 300-resource
# cancel/terminate/reset runs and the persistence check of test_temporal_server.py, and
# test_temporal_tls.py (a server of its own with mTLS required: worker, CLI, API, refusals).
SERVER_TESTS ?= tests/integration/test_temporal_server.py tests/integration/test_crash_recovery.py \
  tests/integration/test_shared_state.py tests/integration/test_steering.py \
  tests/integration/test_approval_and_lock.py tests/integration/test_temporal_tls.py
test-server: setup ## multi-worker and crash tests on the Temporal server + PostgreSQL (not in `make test`)
	@export STACKFLOW_TEMPORAL_MODE=server && scripts/setup.sh temporal-server && scripts/services.sh up && \
	  eval "$$(scripts/services.sh env)" && $(PY) -m pytest -q $(SERVER_TESTS)

test-unit: setup ## only the tests that need no service
	@$(PY) -m pytest -q -m "not integration" tests/unit tests/engine

lint: ## ruff + mypy (the package, and each benchmark: they reach into runtimes)
	@.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy stackflow && \
	  for b in benchmarks/*.py; do MYPYPATH=benchmarks/_lib .venv/bin/mypy --follow-imports=silent $$b || exit 1; done

bench: up ## run the benchmarks under benchmarks/
	@eval "$$(scripts/services.sh env)" && for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b; done

# The docs site (mkdocs.yml, docs/): the `docs` dependency group of uv.lock, added to .venv by
# `uv run` (not in `make setup`: `make demo` does not need it), then a strict build into site/
# (a broken link or anchor, or any other warning, fails it). Needs no service; part of `make test`.
docs: ## build the docs site into site/ (mkdocs build --strict)
	@scripts/docs.sh
