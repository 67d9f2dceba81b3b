// SPDX-License-Identifier: Apache-2.0
#pragma once
// Collectives over a c10d process group (Gloo). One object per process group;
// every call is collective: all ranks must make the same calls in the same
// order. Tensors may live on any device: they are staged through the CPU
// when Gloo cannot take them.
//
// Checked calls (all but all_reduce_async) first gather from every rank what
// it called: the collective, dtype, whole shape (any number of dimensions),
// broadcast src, barrier name (any length, compared in full). Ranks that
// disagree all get the same CollectiveError naming rank 0's call and the
// first rank whose call differs, at once rather than after the timeout.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fulgur {

enum class ReduceOp { kSum, kMean, kMax, kMin };
// "mean"/"avg", "sum", "max", "min", case-insensitive; anything else throws
// std::invalid_argument listing the valid names.
ReduceOp parse_reduce_op(const std::string& name);

// Raised on every rank when a collective fails: a timeout, a peer that left,
// or ranks that disagree on shapes or on which collective they are in.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How Collectives::create joins the process group.
//
// Example:
//   fulgur::RendezvousOptions().rank(r).world_size(n).store_path(dir + "/store")
struct RendezvousOptions {
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, world_size) = 1;
  // Single node: a file store at this path (folder must be private).
  TORCH_ARG(std::string, store_path) = "";
  // Several nodes (store_path empty): a TCP store at host:port; rank 0 serves it.
  TORCH_ARG(std::string, host) = "127.0.0.1";
  TORCH_ARG(int, port) = 0;
  // The store is already served by the outside launcher (torchrun's agent).
  TORCH_ARG(bool, store_served_externally) = false;
  // Keys of this group live under this prefix in the store (a store shared
  // by several launches).
  TORCH_ARG(std::string, store_prefix) = "";
  // Address Gloo binds to and announces. Empty: loopback for a single node
  // (store_path set) or a loopback `host`; else the interfaces named in
  // `socket_ifname`; else the interface that reaches `host`.
  TORCH_ARG(std::string, bind_address) = "";
  // Interfaces for Gloo, comma-separated (GLOO_SOCKET_IFNAME). Ignored on a
  // single node. An unknown name throws std::invalid_argument listing the
  // interfaces that exist.
  TORCH_ARG(std::string, socket_ifname) = "";
  // Ranks per node (rank r is on node r / local_world_size), used to name the
  // node of a rank that fails; 0 when unknown.
  TORCH_ARG(int64_t, local_world_size) = 0;
  // Bound on each collective and on the rendezvous.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  // Check before each collective that all ranks call the same one with the
  // same shapes, and log every collective to stderr.
  TORCH_ARG(bool, debug) = false;
};

// Pending result of an asynchronous all-reduce.
class PendingReduce {
 public:
  virtual ~PendingReduce() = default;
  // Blocks until done; throws CollectiveError on failure.
  virtual void wait() = 0;
};

class Collectives {
 public:
  // Joins the process group; throws CollectiveError naming how many ranks
  // joined ("3/4 joined") when the rendezvous times out, and the port when
  // the TCP store cannot listen.
  static std::shared_ptr<Collectives> create(const RendezvousOptions& options);
  virtual ~Collectives() = default;

  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;

  // In place. Shapes and dtypes are compared across ranks first; a mismatch
  // is a CollectiveError on every rank naming both shapes.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // In place, no shape check: for the gradient buckets whose layout every rank
  // derives from the same model. REQUIRES: CPU tensor. kMean is not allowed.
  virtual std::unique_ptr<PendingReduce> all_reduce_async(at::Tensor& tensor, ReduceOp op) = 0;
  // Returns [world_size, *tensor.shape]; shapes and dtypes must agree.
  virtual at::Tensor all_gather(const at::Tensor& tensor) = 0;
  // Rank `src`'s tensor replaces everyone's (same shape and dtype required).
  // A src outside [0, world_size) is std::invalid_argument on every rank.
  virtual void broadcast(at::Tensor& tensor, int64_t src) = 0;
  // Any value a checkpoint can hold; length sent first, so sizes may differ.
  virtual c10::IValue broadcast_object(const c10::IValue& value, int64_t src) = 0;
  // Blocks until all ranks arrive at a barrier of the same name. A timeout
  // names the barrier ("barrier('epoch-end') (collective #7) timed out ...")
  // and the ranks that did not arrive. Names longer than 64 bytes cost a
  // second small gather.
  virtual void barrier(const std::string& name) = 0;
  // Leaves the group; later calls throw.
  virtual void shutdown() = 0;
};

}  // namespace fulgur
