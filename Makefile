# EdgeCourier: one entry point for building, testing, benchmarking and the demo.
# `make help` lists the targets.

SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
CACHE := $(CURDIR)/.cache
TRACES := $(CACHE)/traces
CARGO_FLAGS := --release --locked
# The EPS ships as one static executable (FROM scratch images, microVM initramfs).
STATIC_TARGET := x86_64-unknown-linux-gnu
EPS_STATIC := target/$(STATIC_TARGET)/eps/ec-eps

.PHONY: help setup system venv rust eps-static build kernel prepare test-rust-build wheel eps-failpoints docker-image appliance xen-host traces lint test test-rust test-python demo bench experiments vectors fuzz clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s $$'\t'

setup: system venv ## Install system packages (LibreOffice, zstd, xdelta3, rsync, rclone, GNU diff, QEMU, ...) and the Python environment

system: ## The Debian packages alone (scripts/setup-system: quiet and quick when all are there)
	@scripts/setup-system

venv: system ## The Python environment alone (.venv, requirements-dev.txt; the project's Python packages import from the checkout)
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >/dev/null
	@$(PY) -m pip install -q -r requirements-dev.txt
	@# The project's pure-Python packages (protocol codec, testbed) import from the checkout.
	@printf '%s\n' $(CURDIR) $(CURDIR)/protocol/python $(CURDIR)/device-proxy > $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/edgecourier.pth

# The compiles need neither the Debian packages nor the Python environment (the Rust toolchain's
# machine has gcc), so under `make -j` (`make test` runs its preparations so) the tools and the
# static EPS compile while scripts/setup-system installs packages; only the installs wait for it.
rust: ## Compile the tools (ecsync, ec-edge, ec-launcher, ec-delayline) into target/release, installing nothing
	cargo build $(CARGO_FLAGS) -p ecsync -p ec-edge -p ec-launcher -p ec-delayline

eps-static: ## Compile the static EPS (profile eps, crt-static) into target/x86_64-unknown-linux-gnu/eps, installing nothing
	RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile eps --locked --target $(STATIC_TARGET) -p ec-eps

build: setup rust eps-static ## Build the core, the EPS and the edge manager: `ecsync`, `ec-eps` (static), `ec-edge`, `ec-launcher` into .venv/bin, the `ec_patch` module into .venv
	install -m 0755 target/release/ecsync $(VENV)/bin/ecsync
	install -m 0755 target/release/ec-edge $(VENV)/bin/ec-edge.new && mv -f $(VENV)/bin/ec-edge.new $(VENV)/bin/ec-edge
	install -m 0755 target/release/ec-launcher $(VENV)/bin/ec-launcher.new && mv -f $(VENV)/bin/ec-launcher.new $(VENV)/bin/ec-launcher
	install -m 0755 target/release/ec-delayline $(VENV)/bin/ec-delayline.new && mv -f $(VENV)/bin/ec-delayline.new $(VENV)/bin/ec-delayline
	cd edit-patch/python && VIRTUAL_ENV=$(VENV) PATH=$(VENV)/bin:$$PATH maturin develop --release -q
	objcopy --strip-all $(EPS_STATIC) $(VENV)/bin/ec-eps.new && mv -f $(VENV)/bin/ec-eps.new $(VENV)/bin/ec-eps

# The device proxy for the people who run it: one wheel, `ec-proxy` (ec_proxy, ec_protocol and the
# compiled ec_patch binding; the `ec-proxy` command), built the way `pip install device-proxy/` builds
# it (device-proxy/pyproject.toml, maturin, device-proxy/wheel_backend.py). cargo builds in the
# workspace's target/ (release profile), so after `make build` only the binding crate is rebuilt.
# device-proxy/tests/test_package.py builds the same wheel itself and installs it into a fresh venv.
wheel: setup ## The device proxy as one installable wheel (`ec-proxy`: proxy, protocol codec, core binding) into target/wheels
	cd device-proxy && PATH=$(VENV)/bin:$$PATH $(PY) -m pip wheel --no-deps --no-build-isolation --progress-bar off -w $(CURDIR)/target/wheels .
	@ls -l target/wheels/ec_proxy-*.whl

# The fail-point EPS shares target/release with the other builds: the crates whose features differ
# are built again beside the plain ones (cargo keys them by features), the dependencies are not
# (a target dir of their own cost a second build of every dependency: minutes on 2 cores).
# target/release/ec-eps is the fail-point EPS afterwards; nothing installs it from there but this.
eps-failpoints: build ## The EPS with fail points compiled in (crash tests only): .venv/bin/ec-eps-failpoints
	cargo build $(CARGO_FLAGS) -p ec-eps --features failpoints
	install -m 0755 target/release/ec-eps $(VENV)/bin/ec-eps-failpoints.new && mv -f $(VENV)/bin/ec-eps-failpoints.new $(VENV)/bin/ec-eps-failpoints

docker-image: build ## The EPS's Docker image FROM scratch (edgecourier/eps:<hash>, :local); rebuilt only when .venv/bin/ec-eps changed
	docker/build $(VENV)/bin/ec-eps

kernel: system ## The appliance's kernel alone (unikernel/build-kernel: minutes on 2 cores the first time, then cached in ~/.cache/edgecourier)
	@unikernel/build-kernel >/dev/null

appliance: build kernel ## The EPS appliance (unikernel/: kernel cached in ~/.cache/edgecourier, initramfs with ec-init and ec-eps) into .venv/share/edgecourier/appliance; boots it once
	unikernel/build $(VENV)

xen-host: system ## The nested Xen host for the xen backend's tests (unikernel/xen-host: Debian's Xen and dom0 kernel, cached in ~/.cache/edgecourier)
	unikernel/xen-host/build

$(TRACES)/manifest.json: experiments/traces/make_traces.py | setup
	$(PY) experiments/traces/make_traces.py --out $(TRACES)

traces: $(TRACES)/manifest.json ## Make the LibreOffice edit traces (cached in .cache/traces)

lint: setup ## rustfmt (the workspace, not vendored code), clippy with warnings as errors, ruff
	cargo fmt --check
	cargo clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check .

# The tests build with the release-test profile (Cargo.toml: release's optimisation without its
# cross-crate LTO and debug info) in target/release-test: faster to compile and link the test
# executables, and target/release (what `make build` installed) is left as it is. The fail-point
# run shares every dependency with the first (eps/providers/Cargo.toml says how): only fail,
# ec-store, ec-providers and their tests are built again, with the fail points compiled in.
TEST_FLAGS := --profile release-test --locked

RUST_TESTS := --workspace --exclude ec-patch-py
FAILPOINT_TESTS := -p ec-store -p ec-providers --features ec-store/failpoints,ec-providers/failpoints

test-rust-build: ## Compile the Rust tests without running them
	cargo test $(TEST_FLAGS) $(RUST_TESTS) --no-run
	cargo test $(TEST_FLAGS) $(FAILPOINT_TESTS) --no-run

test-rust: ## Rust unit, corpus, vector and trace tests; the store's and providers' fail-point tests
	EC_TRACES=$(TRACES) cargo test $(TEST_FLAGS) $(RUST_TESTS)
	cargo test $(TEST_FLAGS) $(FAILPOINT_TESTS)

test-python: ## Python tests (binding, protocol, testbed, EPS and device proxy end to end, benchmark smoke tests)
	EC_TRACES=$(TRACES) EC_FAIL_ON_SKIP=1 $(PY) -m pytest -q --durations=30

# `make test` first makes everything the tests need, as many things at a time as make can start
# (`-j6`): on a fresh machine the Debian packages install, the kernel and the Xen host are made and
# LibreOffice makes the traces while cargo compiles, which leaves neither core idle during the
# downloads, the unpacking and the single-threaded links; cargo's lock on target/ keeps its builds in
# turn. Six jobs, not three: the three cargo builds that need nothing else start at once and hold
# their job slots for the whole compile (half an hour on a loaded machine), and with -j3 the packages,
# the Python environment, the traces, the kernel and the Xen host waited for them in one slot, one
# after the other (seen 2026-11-29). Their output comes as it is written, interleaved (make's
# --output-sync would hold a job's lines until its command ends: ten silent minutes for a cargo
# build). The tests then run one suite at a time, on a machine left to them.
prepare: build eps-failpoints docker-image appliance xen-host traces lint test-rust-build ## Everything `make test` needs, made with as many jobs at a time as make can start under -j

test: ## Set up everything and run all tests
	$(MAKE) -j6 prepare
	$(MAKE) test-rust test-python

demo: build traces ## The main job: a real document edited, patched, and saved by rclone through ec-proxy and ec-eps to a local Dropbox
	$(PY) experiments/demo.py --traces $(TRACES)

experiments: build traces docker-image appliance xen-host ## The original paper's tables and figures on the netns testbed: tables printed, CSV and PNG in .cache/paper (docs/results.md; root)
	EC_TRACES=$(TRACES) $(PY) experiments/paper/all.py --out $(CACHE)/paper

bench: build traces ## Benchmarks (tables printed; see docs/benchmarks.md)
	$(PY) experiments/bench/run_all.py --traces $(TRACES)

vectors: ## Regenerate the golden test vectors of the edit-patch format (only when the format changes)
	cargo run $(CARGO_FLAGS) -p ec-patch --example make_vectors

fuzz: ## Run the fuzz targets for a while (see docs/fuzzing.md)
	edit-patch/fuzz/run

clean: ## Remove build outputs and caches
	cargo clean; rm -rf $(VENV) $(CACHE)
