# troupe: the two README commands (make run, make test) and their parts.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
# With ccache (scripts/install-deps.sh installs it) the compiles go through it: the Python
# package's build in the tests then reuses the main build's objects instead of compiling them
# again (tests/python/package/setup-venv.sh). The build directory is not hashed, so the two
# builds' objects match.
CCACHE := $(shell command -v ccache 2>/dev/null)
CMAKE_FLAGS ?= $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_NOHASHDIR ?= 1

.PHONY: deps configure build test run bench bench-faults clean

deps:
	bash scripts/install-deps.sh

configure:
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Installs the dependencies, builds, and runs the whole test suite (every ctest label).
test: deps
	$(MAKE) build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# Installs the dependencies, builds, and runs the main job on a built-in default: the bundled
# Mooncake conversation trace on a 32-GPU cluster sized for it (docs/simulation.md, "Sizing
# the default run"). The ≈1,000-GPU example with the trace sped up to load it:
#   make run RUN_TOPOLOGY=examples/topologies/v4flash-1k.toml RUN_SPEEDUP=150
RUN_TOPOLOGY ?= examples/topologies/v4flash-trace.toml
RUN_TRACE ?= examples/traces/mooncake_fast25_conversation_trace.jsonl
RUN_SPEEDUP ?= 1
RUN_REPORT ?= $(BUILD_DIR)/report
run: deps
	$(MAKE) build
	$(BUILD_DIR)/troupe sim $(RUN_TOPOLOGY) --trace $(RUN_TRACE) --speedup $(RUN_SPEEDUP) \
	  --report $(RUN_REPORT)

# The benchmarks, each beside its peer; bench_sim on a 5-minute window (the full hour of
# docs/benchmarks.md: build/bench/bench_sim); bench_recipe's Python peers need tools/.venv-recipe;
# bench_serve and serve_vs_generate.py measure troupe serve beside a bare Beast server and
# troupe generate.
bench: build
	$(BUILD_DIR)/bench/bench_supervisor
	$(BUILD_DIR)/bench/bench_sim --minutes 5
	$(BUILD_DIR)/bench/bench_model
	$(BUILD_DIR)/bench/bench_gemm_invariant
	$(BUILD_DIR)/bench/bench_fabric
	$(BUILD_DIR)/bench/bench_recipe $(if $(wildcard tools/.venv-recipe/bin/python),--peer tools/.venv-recipe/bin/python)
	$(BUILD_DIR)/bench/bench_serve
	python3 bench/serve_vs_generate.py --troupe $(BUILD_DIR)/troupe

# The long fault benches (docs/benchmarks.md): the 10,000-seed swarm and the recovery figures
# after a decode rank failure on the 1,040-GPU topology, with and without ready inventory.
bench-faults: build
	bash bench/swarm.sh $(BUILD_DIR)/troupe
	bash bench/recovery.sh $(BUILD_DIR)/troupe $(BUILD_DIR)/recovery

clean:
	rm -rf $(BUILD_DIR)
