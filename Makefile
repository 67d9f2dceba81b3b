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

demo: build
	$(BUILD)/bin/mnist --data-dir data/mnist $(DEMO_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

bench: build
	bench/run.sh

# Each libFuzzer target of fuzz/ for FUZZ_SECONDS, from its committed corpus
# (new inputs go to $(FUZZ_BUILD)/corpus/, crashes to $(FUZZ_BUILD)/crashes/).
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_TARGETS  = $(basename $(notdir $(wildcard fuzz/fuzz_*.cpp)))
fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DFULGUR_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) $(addprefix --target ,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  c=$${t#fuzz_}; mkdir -p $(FUZZ_BUILD)/corpus/$$c $(FUZZ_BUILD)/crashes; \
	  $(FUZZ_BUILD)/fuzz/$$t $(FUZZ_BUILD)/corpus/$$c fuzz/corpus/$$c -max_total_time=$(FUZZ_SECONDS) \
	    -malloc_limit_mb=64 -rss_limit_mb=2048 -artifact_prefix=$(FUZZ_BUILD)/crashes/$$t- || exit 1; \
	done

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
