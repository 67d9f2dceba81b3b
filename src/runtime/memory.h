// SPDX-License-Identifier: Apache-2.0
#pragma once
// The allocator policy (see docs/DECISIONS.md, "Processes, threads and memory"). glibc's malloc
// by default serves every block above a moving threshold (128 KiB at first)
// with its own mmap and gives it back with munmap when freed, and returns the
// top of the heap to the system once more than 128 KiB of it is free. A
// training step frees and reallocates the same activation and gradient
// blocks every step, so each step pays the page faults of touching them
// again, and a step spends much of its time in the kernel's fault handler
// (the figures: docs/DECISIONS.md). The policy keeps freed memory: blocks up to kMmapThreshold come
// from the heap, and the heap is trimmed only above kTrimThreshold of free
// top. Peak resident memory is the same (the step needs those pages anyway).
// Threads other than the main one allocate from arenas of their own, made of
// heaps of at most 64 MiB, and glibc unmaps such a heap (not an arena's first)
// as soon as it is all free, whatever the thresholds say, unless the top pad
// (M_TOP_PAD) covers it. XLA:CPU's threads allocate each execution's
// temporary buffer (tens of MiB for charlm's step) that way, and faulted
// every page of it in again at every step before the policy set the pad to kTopPad. The pad only reserves
// address space; untouched pages cost no memory. A program linked with
// another allocator (fulgur's own link tcmalloc) is not affected: mallopt is
// glibc's.

#include <cstddef>

namespace fulgur::runtime {

inline constexpr size_t kMmapThreshold = size_t{512} << 20;
inline constexpr size_t kTrimThreshold = size_t{1} << 30;
inline constexpr size_t kTopPad = size_t{64} << 20;

// Applies the policy once per process. Leaves glibc alone when the user chose
// its settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_TOP_PAD_, a glibc.malloc tunable in GLIBC_TUNABLES) or set
// FULGUR_MALLOC_POLICY=off.
// Any other value of FULGUR_MALLOC_POLICY than on/1/off/0 is an error.
void apply_malloc_policy();

}  // namespace fulgur::runtime
