// SPDX-License-Identifier: Apache-2.0
#pragma once
// The generator that random ops on xla devices draw from: dropout (aten::native_dropout),
// rand/rand_like (uniform_), randn/randn_like (normal_) and bernoulli. Their values are made
// on the device, in the step's graph, by a counter-based generator (Threefry-2x32): a draw of n
// numbers reads the generator's state (key, offset), a device tensor of two int64s, and writes
// (key, offset + n) back, so the state is an input of the graph and an updated output, like a
// parameter. Nothing is drawn on the host.
//
// The key is made from the seed and this process's global rank (a running stage's, else the
// detected cluster environment's) when the first draw after a seeding happens, so that every
// rank draws its own numbers and a run seeded alike draws the same ones. seed_everything seeds
// it; torch::manual_seed does not (as torch_xla's device generators). The Trainer saves every
// rank's state in its checkpoints ("rng_states" -> "xla") and restores it on resume, as it does
// the CPU generator's.
//
// Thread safety: each function locks the generator; draws come from the thread that traces.

#include <cstdint>

namespace at {
class Tensor;
}  // namespace at

namespace fulgur::xla {

// The key comes from `seed` (and the rank) at the next draw, the offset starts at 0. Does not
// start the xla backend. Before any seeding the seed is libtorch's default CPU seed.
void manual_seed(uint64_t seed);

// The state (key, offset) as a CPU int64 tensor of 2 elements. Runs the pending graph that
// updates it, if any (one step mark earlier, it is a download of 16 bytes).
at::Tensor rng_state();

// Makes `state` (what rng_state() returned) the state of the next draw.
// Throws std::invalid_argument for a tensor that is not 2 int64s.
void set_rng_state(const at::Tensor& state);

}  // namespace fulgur::xla
