# The user's entry points. Each installs what is missing, configures, builds, then runs.
BUILD   ?= build
JOBS    ?= $(shell nproc)
DEMO_ARGS ?= --accelerator xla --devices auto --strategy xla --max-epochs 1

.PHONY: all deps configure build demo test bench clean

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

clean:
	rm -rf $(BUILD)
