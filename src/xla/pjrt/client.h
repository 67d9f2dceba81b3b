// SPDX-License-Identifier: Apache-2.0
#pragma once
// A PJRT client on one device, the buffers on it and the executables compiled for it. Every
// handle owns what the plugin gave out and destroys it; a failed call throws PjrtError
// (plugin.h). Buffers and executables must be destroyed before their client.
//
// Thread safety: the plugin's objects are thread-safe; these wrappers add no state of their own
// except process_client()'s one-time creation.
//
// Example:
//   Client& client = process_client();
//   Executable add = client.compile(
//       "func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {\n"
//       "  %0 = stablehlo.add %a, %b : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n");
//   float x[2] = {1, 2};
//   Buffer a = client.to_device(x, ElementType::f32, {2});
//   std::vector<Buffer> out = add.execute({&a, &a});
//   out[0].to_host(x, sizeof x);  // {2, 4}

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xla/pjrt/plugin.h"

struct PJRT_Buffer;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_LoadedExecutable;

namespace fulgur::xla::pjrt {

// Element types of device buffers; the values are PJRT_Buffer_Type's.
enum class ElementType : int {
  pred = 1, s8 = 2, s16 = 3, s32 = 4, s64 = 5, u8 = 6, f16 = 10, f32 = 11, f64 = 12, bf16 = 13
};

// Bytes per element; throws std::invalid_argument for a value outside ElementType.
size_t element_size(ElementType type);

class Buffer {
 public:
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  ElementType element_type() const;
  std::vector<int64_t> dims() const;
  // True once an execution took the buffer over (Executable::execute's `donated`).
  bool is_deleted() const;
  // Copies the buffer's dense row-major contents into `dst` and waits for the copy (and so for
  // the computation that produces the buffer). REQUIRES: `bytes` is the buffer's size.
  void to_host(void* dst, size_t bytes) const;

  PJRT_Buffer* get() const { return buffer_; }

 private:
  friend class Client;
  friend class Executable;
  Buffer(const Plugin& plugin, PJRT_Buffer* buffer) : plugin_(&plugin), buffer_(buffer) {}

  const Plugin* plugin_;
  PJRT_Buffer* buffer_;
};

class Executable {
 public:
  Executable(Executable&& other) noexcept;
  Executable& operator=(Executable&& other) noexcept;
  ~Executable();

  size_t num_outputs() const { return num_outputs_; }
  // Floating-point operations of one execution by XLA's cost analysis of the compiled program
  // (PJRT_Executable_GetCostAnalysis, property "flops"); -1 when the plugin does not say.
  double flops() const { return flops_; }
  // Runs the program on the client's device with `args` (in the order of the program's
  // parameters). The outputs may still be computing when this returns; Buffer::to_host waits.
  //
  // `donated`: arguments (each one of `args`) the execution may take over. An argument the
  // program aliases to a result (`tf.aliasing_output`) that is in `donated` gives its memory to
  // that result and is deleted (is_deleted()); one that is not is copied by the plugin first,
  // so it keeps its value. The executable keeps the donated buffers until the execution has
  // finished (PJRT_Buffer_Destroy of a donated buffer waits for it; the caller may be many
  // executions ahead) and destroys them in a later call, or when it is destroyed.
  std::vector<Buffer> execute(const std::vector<const Buffer*>& args,
                              std::vector<std::shared_ptr<const Buffer>> donated = {}) const;

 private:
  friend class Client;
  Executable(const Plugin& plugin, PJRT_Device* device, PJRT_LoadedExecutable* executable);

  struct Donated;  // donated buffers of executions that may still run

  const Plugin* plugin_;
  PJRT_Device* device_;
  PJRT_LoadedExecutable* executable_;
  size_t num_outputs_ = 0;
  double flops_ = -1;
  std::unique_ptr<Donated> donated_;  // reaped, waiting, before the executable is destroyed
};

struct ClientOptions {
  // The CPU plugin's `cpu_device_count` create option; unset: no option is passed (other
  // plugins may refuse options they do not know).
  std::optional<int64_t> cpu_device_count = 1;
  // Workers sharing this machine. Before the client exists, PJRT_NPROC (the size of XLA:CPU's
  // thread pools) is set to runtime::threads_per_worker(local_world_size), unless the
  // environment already has PJRT_NPROC.
  int64_t local_world_size = 1;
  // This process's place among the workers of its machine: when the plugin shows this process
  // several addressable devices, it takes the local_rank-th (one device per rank, as torch_xla).
  int64_t local_rank = 0;
  // The `visible_devices` create option (the PJRT GPU plugin's: the CUDA devices the client may
  // use); unset: not passed.
  std::optional<std::vector<int64_t>> visible_devices;
  // (A client of the pinned CPU plugin also adds fulgur's XLA options to XLA_FLAGS, each unless
  // XLA_FLAGS names it already: reductions as XNNPACK fusions.)
};

// The variables torch_xla sets for each process of a multi-process job on a TPU host (its
// _internal/tpu.py configure_topology), before the process's client exists: the chip it owns
// (TPU_VISIBLE_CHIPS = local_rank, TPU_CHIPS_PER_PROCESS_BOUNDS = 1,1,1), the processes' grid
// (TPU_PROCESS_BOUNDS = the host's chip grid times the hosts' grid), its port and every
// process's address (TPU_PROCESS_PORT = 8476 + local_rank, TPU_PROCESS_ADDRESSES over the hosts
// of TPU_WORKER_HOSTNAMES, default localhost), and its task id (CLOUD_TPU_TASK_ID = worker id *
// local_world_size + local_rank, worker id from TPU_WORKER_ID, default 0). The host's chip grid
// is TPU_CHIPS_PER_HOST_BOUNDS, else by the number of processes (1: 1,1,1; 2: 1,2,1; 4: 2,2,1;
// 8: 2,4,1); the hosts' grid TPU_HOST_BOUNDS, else 1,1,1. `env` gives a variable's value or
// nullptr; a variable it already has is left out (the user's value wins). Throws
// std::invalid_argument naming a value that is not a grid "x,y,z" or a process count without a
// default grid.
// The addressable devices process_client() would see in this process, counted by a child
// process that creates it (so that this process never starts a plugin, whose threads do not
// survive the fork of the workers). Throws std::runtime_error with the child's message when the
// client cannot be made.
int64_t count_addressable_devices_in_child();

std::vector<std::pair<std::string, std::string>> tpu_process_environment(
    int64_t local_rank, int64_t local_world_size, const std::function<const char*(const char*)>& env);

class Client {
 public:
  // A client of `plugin` on the plugin's first addressable device.
  Client(const Plugin& plugin, const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Plugin& plugin() const { return *plugin_; }
  const std::string& platform_name() const { return platform_name_; }
  size_t addressable_devices() const { return addressable_devices_; }
  // The id the plugin gives this client's device (PJRT_DeviceDescription_Id).
  int64_t device_id() const;

  // Compiles a StableHLO module given as MLIR text (format "mlir") for one replica and one
  // partition. Throws PjrtError with the plugin's diagnostics if the program is rejected.
  //
  // With a compile cache folder (compile_cache_dir(), compile_cache.h) and a plugin that can
  // serialize executables, the program is first looked up there, under a key of its text, the
  // compile options and plugin_identity(), and loaded instead of compiled when found; a program
  // compiled is written there for later processes. An entry that fails a check, or that the
  // plugin refuses to load, is ignored with a warning and replaced.
  Executable compile(const std::string& stablehlo) const;

  // The allocator statistics of the client's device (PJRT_Device_MemoryStats), by name:
  // bytes_in_use, and those of peak_bytes_in_use, num_allocs, largest_alloc_size, bytes_limit,
  // bytes_reserved, peak_bytes_reserved, bytes_reservable_limit, largest_free_block_bytes,
  // pool_bytes, peak_pool_bytes the plugin gives. Empty when the plugin has no statistics.
  std::map<std::string, int64_t> memory_stats() const;

  // What besides the program decides the compiled code, as text: the plugin file (path, size,
  // modification time), its API version and attributes (XLA's version among them), the platform,
  // the device kind, XLA_FLAGS as the client was created with, and on the CPU platform the host
  // CPU's model and features (XLA:CPU compiles for the host it runs on, and a cache folder may be
  // shared by machines of several kinds). Part of each compile cache key.
  const std::string& plugin_identity() const;

  // Copies `dims`-shaped dense row-major data of `type` to the device; `data` may be reused as
  // soon as this returns.
  Buffer to_device(const void* data, ElementType type, const std::vector<int64_t>& dims) const;

 private:
  Executable compile_uncached(const std::string& stablehlo) const;

  const Plugin* plugin_;
  PJRT_Client* client_ = nullptr;
  PJRT_Device* device_ = nullptr;
  size_t addressable_devices_ = 0;
  std::string platform_name_;
  std::string xla_flags_;  // XLA_FLAGS when the client was created (XLA reads it then)
  mutable std::once_flag identity_once_;
  mutable std::string identity_;
};

// This process's client, created on first use from the plugin choose_plugin() picks
// (PJRT_DEVICE, PJRT_LIBRARY_PATH; see plugin_choice.h) with LOCAL_WORLD_SIZE workers per
// machine (1 if unset). It lives until the process ends and is never destroyed, because
// plugins' threads may still run during static destruction. Thread-safe. Throws
// std::logic_error in a process forked after the client was created (the plugin's threads
// stay behind in the parent), naming both processes.
Client& process_client();

}  // namespace fulgur::xla::pjrt
