# SPDX-License-Identifier: Apache-2.0
# The user's entry points. Each installs what is missing, configures, builds, then runs.
BUILD   ?= build
JOBS    ?= $(shell nproc)
DEMO_ARGS ?= --accelerator xla --devices auto --strategy xla --max-epochs 1

.PHONY: all deps configure build demo test bench fuzz clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DFULGUR_FUZZ=ON

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Builds only what the demo runs (the library and the mnist example) and times each part.
demo:
	@BUILD=$(BUILD) JOBS=$(JOBS) scripts/demo $(DEMO_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

bench: build
	bench/run.sh

# Each libFuzzer target of fuzz/ for FUZZ_SECONDS, from its committed corpus,
# built in make test's tree (configured with FULGUR_FUZZ=ON; new inputs go to
# $(BUILD)/fuzz-corpus/, crashes to $(BUILD)/fuzz-crashes/).
FUZZ_SECONDS ?= 600
FUZZ_TARGETS  = $(basename $(notdir $(wildcard fuzz/fuzz_*.cpp)))
fuzz: configure
	cmake --build $(BUILD) -j $(JOBS) $(addprefix --target ,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  c=$${t#fuzz_}; mkdir -p $(BUILD)/fuzz-corpus/$$c $(BUILD)/fuzz-crashes; \
	  $(BUILD)/fuzz/$$t $(BUILD)/fuzz-corpus/$$c fuzz/corpus/$$c -max_total_time=$(FUZZ_SECONDS) \
	    -malloc_limit_mb=64 -rss_limit_mb=2048 -artifact_prefix=$(BUILD)/fuzz-crashes/$$t- || exit 1; \
	done

clean:
	rm -rf $(BUILD)
