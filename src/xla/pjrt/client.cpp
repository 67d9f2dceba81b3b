// SPDX-License-Identifier: Apache-2.0
// The PJRT client, its buffers and executables (client.h), the compile cache's use of them, and
// the thread and flag settings a process makes before its client exists. Longer than 450 lines
// because every PJRT call here fills and checks its own argument struct (about 15 lines each, 30
// calls); the TPU variables and the device count are in process_setup.cpp.
#include "xla/pjrt/client.h"

#include "runtime/env.h"

#include <pjrt_c_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/log.h"
#include "runtime/threads.h"
#include "xla/pjrt/compile_cache.h"
#include "xla/pjrt/metrics.h"
#include "xla/pjrt/plugin_choice.h"

namespace fulgur::xla::pjrt {
namespace {

// xla.CompileOptionsProto, serialized: executable_build_options {num_replicas: 1,
// num_partitions: 1}, compile_portable_executable: true. An empty message means 0 replicas,
// which the CPU plugin does not survive.
constexpr char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};

static_assert(static_cast<int>(ElementType::pred) == PJRT_Buffer_Type_PRED);
static_assert(static_cast<int>(ElementType::s8) == PJRT_Buffer_Type_S8);
static_assert(static_cast<int>(ElementType::s16) == PJRT_Buffer_Type_S16);
static_assert(static_cast<int>(ElementType::s32) == PJRT_Buffer_Type_S32);
static_assert(static_cast<int>(ElementType::s64) == PJRT_Buffer_Type_S64);
static_assert(static_cast<int>(ElementType::u8) == PJRT_Buffer_Type_U8);
static_assert(static_cast<int>(ElementType::f16) == PJRT_Buffer_Type_F16);
static_assert(static_cast<int>(ElementType::f32) == PJRT_Buffer_Type_F32);
static_assert(static_cast<int>(ElementType::f64) == PJRT_Buffer_Type_F64);
static_assert(static_cast<int>(ElementType::bf16) == PJRT_Buffer_Type_BF16);

// Frees an error that is not reported: of a destroy call made from a destructor, or of an
// optional query the plugin does not support.
void destroy_quietly(const Plugin& plugin, PJRT_Error* error) {
  if (!error) return;
  PJRT_Error_Destroy_Args d{};
  d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
  d.error = error;
  plugin.api()->PJRT_Error_Destroy(&d);
}

// An event the plugin handed out, destroyed with it.
class Event {
 public:
  Event(const Plugin& plugin, PJRT_Event* event) : plugin_(plugin), event_(event) {}
  ~Event() {
    if (!event_) return;
    PJRT_Event_Destroy_Args d{};
    d.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
    d.event = event_;
    destroy_quietly(plugin_, plugin_.api()->PJRT_Event_Destroy(&d));
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Whether the operation the event stands for has finished (successfully or not).
  bool ready() const {
    if (!event_) return true;
    PJRT_Event_IsReady_Args a{};
    a.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE;
    a.event = event_;
    plugin_.check(plugin_.api()->PJRT_Event_IsReady(&a), "PJRT_Event_IsReady");
    return a.is_ready;
  }

  // Waits for the event; throws PjrtError naming `call` (the operation it stands for) if that
  // operation failed.
  void await(const char* call) const {
    if (!event_) return;
    PJRT_Event_Await_Args a{};
    a.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
    a.event = event_;
    plugin_.check(plugin_.api()->PJRT_Event_Await(&a), call);
  }

 private:
  const Plugin& plugin_;
  PJRT_Event* event_;
};

void destroy_buffer(const Plugin& plugin, PJRT_Buffer* buffer) {
  PJRT_Buffer_Destroy_Args d{};
  d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  d.buffer = buffer;
  destroy_quietly(plugin, plugin.api()->PJRT_Buffer_Destroy(&d));
}

void destroy_executable(const Plugin& plugin, PJRT_LoadedExecutable* executable) {
  PJRT_LoadedExecutable_Destroy_Args d{};
  d.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
  d.executable = executable;
  destroy_quietly(plugin, plugin.api()->PJRT_LoadedExecutable_Destroy(&d));
}

// Whether the plugin's function table reaches `name` and fills it: functions past those every
// plugin must have (plugin.cpp's kApiFieldsUsed) are used only when this holds.
#define FULGUR_PJRT_HAS(api, name) \
  ((api)->struct_size >= PJRT_STRUCT_SIZE(PJRT_Api, name) && (api)->name != nullptr)

// The serialized form of `executable` (PJRT_Executable_Serialize), for the compile cache.
std::string serialize(const Plugin& plugin, PJRT_LoadedExecutable* executable) {
  PJRT_LoadedExecutable_GetExecutable_Args g{};
  g.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  g.loaded_executable = executable;
  plugin.check(plugin.api()->PJRT_LoadedExecutable_GetExecutable(&g), "PJRT_LoadedExecutable_GetExecutable");
  PJRT_Executable_Serialize_Args a{};
  a.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE;
  a.executable = g.executable;
  PJRT_Error* error = plugin.api()->PJRT_Executable_Serialize(&a);
  std::string bytes;
  if (!error) {
    bytes.assign(a.serialized_bytes, a.serialized_bytes_size);
    if (a.serialized_executable_deleter) a.serialized_executable_deleter(a.serialized_executable);
  }
  PJRT_Executable_Destroy_Args d{};
  d.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
  d.executable = g.executable;
  destroy_quietly(plugin, plugin.api()->PJRT_Executable_Destroy(&d));
  plugin.check(error, "PJRT_Executable_Serialize");
  return bytes;
}

// The host CPU's model and feature flags (/proc/cpuinfo's first "model name" and "flags" lines):
// code XLA:CPU compiled for one host may use instructions another lacks.
std::string host_cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line;
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
  }
  return model + "\n" + flags + "\n";
}

void set_thread_count(int64_t local_world_size) {
  const std::string n = std::to_string(runtime::threads_per_worker(local_world_size));
  setenv("PJRT_NPROC", n.c_str(), /*overwrite=*/0);
}

// The XLA options fulgur gives the pinned CPU plugin, each unless XLA_FLAGS already names it
// (XLA reads XLA_FLAGS once, when the first client starts). Reductions run as XNNPACK fusions:
// on this project's Intel machine the charlm step was 0.84x, the MNIST CNN's 0.96x and the MLP's
// 0.99x with it, and the losses came closer to eager's (the MLP's after 300 steps equal to the
// printed digits; bench/history/libtorch-1.13.md). Another plugin gets nothing: its XLA may
// not know a flag, and XLA aborts on an unknown one.
void set_cpu_plugin_flag_defaults() {
  static const std::pair<const char*, const char*> kDefaults[] = {
      {"xla_cpu_experimental_xnn_fusion_type", "LIBRARY_FUSION_TYPE_REDUCE"},
  };
  std::string flags = runtime::env_string("XLA_FLAGS");
  for (const auto& [name, value] : kDefaults) {
    if (flags.find(name) != std::string::npos) continue;
    flags += (flags.empty() ? "--" : " --") + std::string(name) + "=" + value;
  }
  setenv("XLA_FLAGS", flags.c_str(), /*overwrite=*/1);
}

}  // namespace

size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::pred:
    case ElementType::s8:
    case ElementType::u8: return 1;
    case ElementType::s16:
    case ElementType::f16:
    case ElementType::bf16: return 2;
    case ElementType::s32:
    case ElementType::f32: return 4;
    case ElementType::s64:
    case ElementType::f64: return 8;
  }
  throw std::invalid_argument("element_size: PJRT buffer type " + std::to_string(static_cast<int>(type)) +
                              " is not one fulgur uses");
}

// ---------------------------------------------------------------- Buffer

Buffer::Buffer(Buffer&& other) noexcept : plugin_(other.plugin_), buffer_(std::exchange(other.buffer_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (buffer_) destroy_buffer(*plugin_, buffer_);
    plugin_ = other.plugin_;
    buffer_ = std::exchange(other.buffer_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() {
  if (buffer_) destroy_buffer(*plugin_, buffer_);
}

ElementType Buffer::element_type() const {
  PJRT_Buffer_ElementType_Args a{};
  a.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE;
  a.buffer = buffer_;
  plugin_->check(plugin_->api()->PJRT_Buffer_ElementType(&a), "PJRT_Buffer_ElementType");
  return static_cast<ElementType>(a.type);
}

bool Buffer::is_deleted() const {
  PJRT_Buffer_IsDeleted_Args a{};
  a.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
  a.buffer = buffer_;
  plugin_->check(plugin_->api()->PJRT_Buffer_IsDeleted(&a), "PJRT_Buffer_IsDeleted");
  return a.is_deleted;
}

std::vector<int64_t> Buffer::dims() const {
  PJRT_Buffer_Dimensions_Args a{};
  a.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE;
  a.buffer = buffer_;
  plugin_->check(plugin_->api()->PJRT_Buffer_Dimensions(&a), "PJRT_Buffer_Dimensions");
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

void Buffer::to_host(void* dst, size_t bytes) const {
  PJRT_Buffer_ToHostBuffer_Args a{};
  a.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  a.src = buffer_;
  a.dst = nullptr;  // first ask for the size
  plugin_->check(plugin_->api()->PJRT_Buffer_ToHostBuffer(&a), "PJRT_Buffer_ToHostBuffer");
  if (a.dst_size != bytes)
    throw std::invalid_argument("Buffer::to_host: the buffer holds " + std::to_string(a.dst_size) +
                                " bytes, the destination " + std::to_string(bytes));
  a.dst = dst;
  a.event = nullptr;
  plugin_->check(plugin_->api()->PJRT_Buffer_ToHostBuffer(&a), "PJRT_Buffer_ToHostBuffer");
  Event done(*plugin_, a.event);
  done.await("PJRT_Buffer_ToHostBuffer");
  detail::count_to_host(static_cast<int64_t>(bytes));
}

// ---------------------------------------------------------------- Executable

// The buffers executions took over, each batch with the event of its execution's end, oldest
// first. Destroyed once that event is ready, so that no destroy waits.
struct Executable::Donated {
  std::mutex mu;
  std::deque<std::pair<std::unique_ptr<Event>, std::vector<std::shared_ptr<const Buffer>>>> pending;

  // Destroys the batches whose execution has finished; every batch, waiting for each, if `all`.
  void reap(bool all) {
    std::lock_guard<std::mutex> lock(mu);
    while (!pending.empty()) {
      Event& done = *pending.front().first;
      if (all) {
        try {
          done.await("PJRT_LoadedExecutable_Execute");
        } catch (const std::exception&) {
          // the execution's own error reached its results' readers
        }
      } else if (!done.ready()) {
        break;
      }
      pending.pop_front();
    }
  }
};

namespace {

// The "flops" property of XLA's cost analysis of the compiled program (HloCostAnalysis: two per
// multiply-add of a dot or convolution, one per elementwise op), or -1 when the plugin has no
// cost analysis or does not give that property. The properties belong to `executable`, so they
// are read before it is destroyed.
double cost_analysis_flops(const Plugin& plugin, PJRT_Executable* executable) {
  if (!plugin.api()->PJRT_Executable_GetCostAnalysis) return -1;
  PJRT_Executable_GetCostAnalysis_Args c{};
  c.struct_size = PJRT_Executable_GetCostAnalysis_Args_STRUCT_SIZE;
  c.executable = executable;
  if (PJRT_Error* error = plugin.api()->PJRT_Executable_GetCostAnalysis(&c)) {
    destroy_quietly(plugin, error);
    return -1;
  }
  for (size_t i = 0; i < c.num_properties; ++i) {
    const PJRT_NamedValue& v = c.properties[i];
    if (std::string_view(v.name, v.name_size) != "flops") continue;
    if (v.type == PJRT_NamedValue_kFloat) return v.float_value;
    if (v.type == PJRT_NamedValue_kInt64) return static_cast<double>(v.int64_value);
  }
  return -1;
}

}  // namespace

Executable::Executable(const Plugin& plugin, PJRT_Device* device, PJRT_LoadedExecutable* executable)
    : plugin_(&plugin), device_(device), executable_(executable), donated_(std::make_unique<Donated>()) {
  PJRT_LoadedExecutable_GetExecutable_Args g{};
  g.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  g.loaded_executable = executable_;
  try {
    plugin.check(plugin.api()->PJRT_LoadedExecutable_GetExecutable(&g), "PJRT_LoadedExecutable_GetExecutable");
    PJRT_Executable_NumOutputs_Args n{};
    n.struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE;
    n.executable = g.executable;
    PJRT_Error* error = plugin.api()->PJRT_Executable_NumOutputs(&n);
    if (!error) flops_ = cost_analysis_flops(plugin, g.executable);
    PJRT_Executable_Destroy_Args d{};
    d.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
    d.executable = g.executable;
    destroy_quietly(plugin, plugin.api()->PJRT_Executable_Destroy(&d));
    plugin.check(error, "PJRT_Executable_NumOutputs");
    num_outputs_ = n.num_outputs;
  } catch (...) {
    destroy_executable(plugin, executable_);
    throw;
  }
}

Executable::Executable(Executable&& other) noexcept
    : plugin_(other.plugin_),
      device_(other.device_),
      executable_(std::exchange(other.executable_, nullptr)),
      num_outputs_(other.num_outputs_),
      flops_(other.flops_),
      donated_(std::move(other.donated_)) {}

Executable& Executable::operator=(Executable&& other) noexcept {
  if (this != &other) {
    if (donated_) donated_->reap(true);
    if (executable_) destroy_executable(*plugin_, executable_);
    plugin_ = other.plugin_;
    device_ = other.device_;
    executable_ = std::exchange(other.executable_, nullptr);
    num_outputs_ = other.num_outputs_;
    flops_ = other.flops_;
    donated_ = std::move(other.donated_);
  }
  return *this;
}

Executable::~Executable() {
  if (donated_) donated_->reap(true);
  if (executable_) destroy_executable(*plugin_, executable_);
}

std::vector<Buffer> Executable::execute(const std::vector<const Buffer*>& args,
                                        std::vector<std::shared_ptr<const Buffer>> donated) const {
  std::vector<PJRT_Buffer*> inputs;
  inputs.reserve(args.size());
  for (const Buffer* b : args) inputs.push_back(b->get());
  // PJRT donates every aliased argument but those it is told to keep.
  std::vector<bool> donate(args.size(), false);
  for (const auto& d : donated) {
    const auto it = std::find(args.begin(), args.end(), d.get());
    if (it == args.end()) throw std::invalid_argument("Executable::execute: a donated buffer is not an argument");
    donate[static_cast<size_t>(it - args.begin())] = true;
  }
  std::vector<int64_t> kept;
  for (size_t i = 0; i < args.size(); ++i)
    if (!donate[i]) kept.push_back(static_cast<int64_t>(i));
  PJRT_Buffer* const* argument_lists[] = {inputs.data()};
  std::vector<PJRT_Buffer*> outputs(num_outputs_, nullptr);
  PJRT_Buffer** output_lists[] = {outputs.data()};

  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  options.non_donatable_input_indices = kept.data();
  options.num_non_donatable_input_indices = kept.size();
  PJRT_LoadedExecutable_Execute_Args a{};
  a.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  a.executable = executable_;
  a.options = &options;
  a.argument_lists = argument_lists;
  a.num_devices = 1;
  a.num_args = inputs.size();
  a.output_lists = output_lists;
  // A portable executable has no device assignment of its own.
  a.execute_device = device_;
  PJRT_Event* done = nullptr;
  if (!donated.empty()) a.device_complete_events = &done;
  donated_->reap(false);
  plugin_->check(plugin_->api()->PJRT_LoadedExecutable_Execute(&a), "PJRT_LoadedExecutable_Execute");
  if (!donated.empty()) {
    auto event = std::make_unique<Event>(*plugin_, done);
    std::lock_guard<std::mutex> lock(donated_->mu);
    donated_->pending.emplace_back(std::move(event), std::move(donated));
  }
  detail::count_execution(flops_);
  std::vector<Buffer> result;
  result.reserve(outputs.size());
  for (PJRT_Buffer* b : outputs) result.push_back(Buffer(*plugin_, b));
  return result;
}

// ---------------------------------------------------------------- Client

Client::Client(const Plugin& plugin, const ClientOptions& options) : plugin_(&plugin) {
  set_thread_count(options.local_world_size);
  const PluginLocations pinned = PluginLocations::built_in();
  if (plugin.path() == pinned.cpu_plugin || plugin.path() == pinned.installed_cpu_plugin) set_cpu_plugin_flag_defaults();
  const std::string device_count = "cpu_device_count", visible = "visible_devices";
  PJRT_NamedValue create_options[2]{};
  size_t num_options = 0;
  // The next create option, named (the name outlives the call) and typed; the caller sets its value.
  auto option = [&](const std::string& name, PJRT_NamedValue_Type type) -> PJRT_NamedValue& {
    PJRT_NamedValue& v = create_options[num_options++];
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = name.c_str();
    v.name_size = name.size();
    v.type = type;
    return v;
  };
  if (options.cpu_device_count) {
    PJRT_NamedValue& v = option(device_count, PJRT_NamedValue_kInt64);
    v.int64_value = *options.cpu_device_count;
    v.value_size = 1;
  }
  if (options.visible_devices) {
    PJRT_NamedValue& v = option(visible, PJRT_NamedValue_kInt64List);
    v.int64_array_value = options.visible_devices->data();
    v.value_size = options.visible_devices->size();
  }
  PJRT_Client_Create_Args c{};
  c.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
  c.create_options = create_options;
  c.num_options = num_options;
  plugin.check(plugin.api()->PJRT_Client_Create(&c), "PJRT_Client_Create");
  client_ = c.client;
  try {
    PJRT_Client_PlatformName_Args p{};
    p.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE;
    p.client = client_;
    plugin.check(plugin.api()->PJRT_Client_PlatformName(&p), "PJRT_Client_PlatformName");
    platform_name_.assign(p.platform_name, p.platform_name_size);
    PJRT_Client_AddressableDevices_Args d{};
    d.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
    d.client = client_;
    plugin.check(plugin.api()->PJRT_Client_AddressableDevices(&d), "PJRT_Client_AddressableDevices");
    if (d.num_addressable_devices == 0)
      throw PjrtError("PJRT_Client_AddressableDevices", plugin.path(), "the client has no addressable device");
    addressable_devices_ = d.num_addressable_devices;
    // One device: the process was given its own (visible_devices, TPU_VISIBLE_CHIPS, the CPU
    // plugin's one device). Several: local rank k takes the k-th, as torch_xla does.
    size_t k = 0;
    if (addressable_devices_ > 1) {
      if (options.local_rank < 0 || static_cast<size_t>(options.local_rank) >= addressable_devices_)
        throw PjrtError("PJRT_Client_AddressableDevices", plugin.path(),
                        "local rank " + std::to_string(options.local_rank) + " takes addressable device " +
                            std::to_string(options.local_rank) + ", but the plugin shows " +
                            std::to_string(addressable_devices_) + " (devices 0.." +
                            std::to_string(addressable_devices_ - 1) + "); start at most " +
                            std::to_string(addressable_devices_) + " processes on this machine");
      k = static_cast<size_t>(options.local_rank);
    }
    device_ = d.addressable_devices[k];
    xla_flags_ = runtime::env_string("XLA_FLAGS");
  } catch (...) {
    PJRT_Client_Destroy_Args x{};
    x.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
    x.client = client_;
    destroy_quietly(plugin, plugin.api()->PJRT_Client_Destroy(&x));
    throw;
  }
}

int64_t Client::device_id() const {
  PJRT_Device_GetDescription_Args g{};
  g.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
  g.device = device_;
  plugin_->check(plugin_->api()->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription");
  PJRT_DeviceDescription_Id_Args i{};
  i.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE;
  i.device_description = g.device_description;
  plugin_->check(plugin_->api()->PJRT_DeviceDescription_Id(&i), "PJRT_DeviceDescription_Id");
  return i.id;
}

Client::~Client() {
  PJRT_Client_Destroy_Args x{};
  x.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  x.client = client_;
  destroy_quietly(*plugin_, plugin_->api()->PJRT_Client_Destroy(&x));
}

const std::string& Client::plugin_identity() const {
  std::call_once(identity_once_, [this] {
    std::ostringstream o;
    o << "plugin " << plugin_->path() << "\n";
    struct stat st {};
    if (::stat(plugin_->path().c_str(), &st) == 0)
      o << "size " << st.st_size << " modified " << st.st_mtim.tv_sec << "." << st.st_mtim.tv_nsec << "\n";
    o << "api " << plugin_->major_version() << "." << plugin_->minor_version() << "\n";
    for (const auto& [name, value] : plugin_->attributes()) o << "attribute " << name << "=" << value << "\n";
    o << "platform " << platform_name_ << "\n";
    const PJRT_Api* api = plugin_->api();
    if (FULGUR_PJRT_HAS(api, PJRT_DeviceDescription_Kind)) {
      PJRT_Device_GetDescription_Args g{};
      g.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
      g.device = device_;
      plugin_->check(api->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription");
      PJRT_DeviceDescription_Kind_Args k{};
      k.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE;
      k.device_description = g.device_description;
      plugin_->check(api->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
      o << "device kind " << std::string(k.device_kind, k.device_kind_size) << "\n";
    }
    o << "XLA_FLAGS " << xla_flags_ << "\n";
    if (platform_name_ == "cpu") o << host_cpu_description();
    identity_ = o.str();
  });
  return identity_;
}

Executable Client::compile(const std::string& stablehlo) const {
  const PJRT_Api* api = plugin_->api();
  const std::optional<std::string> dir = compile_cache_dir();
  if (!dir || !FULGUR_PJRT_HAS(api, PJRT_Executable_Serialize) ||
      !FULGUR_PJRT_HAS(api, PJRT_Executable_DeserializeAndLoad))
    return compile_uncached(stablehlo);
  const CompileCache cache(*dir);
  if (!cache.usable()) return compile_uncached(stablehlo);
  const CacheKey key =
      compile_cache_key(stablehlo, std::string_view(kCompileOptions, sizeof kCompileOptions), plugin_identity());
  if (const std::optional<std::string> payload = cache.load(key)) {
    PJRT_Executable_DeserializeAndLoad_Args a{};
    a.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE;
    a.client = client_;
    a.serialized_executable = payload->data();
    a.serialized_executable_size = payload->size();
    try {
      plugin_->check(api->PJRT_Executable_DeserializeAndLoad(&a), "PJRT_Executable_DeserializeAndLoad");
      Executable loaded(*plugin_, device_, a.loaded_executable);
      detail::count_cache_hit();
      return loaded;
    } catch (const PjrtError& e) {
      cache.reject(key, "the plugin could not load it (" + e.cause() + ")");
    }
  }
  detail::count_cache_miss();
  Executable compiled = compile_uncached(stablehlo);
  try {
    cache.store(key, serialize(*plugin_, compiled.executable_));
  } catch (const PjrtError& e) {
    // The plugin may refuse some programs only: the pinned CPU plugin cannot serialize an XNNPACK
    // fusion, which fulgur's default XLA_FLAGS make of reductions, so this happens in every run of
    // that configuration, where the user chose nothing and can change nothing without slower
    // steps (bench/RESULTS.md): said once per cause and process, by rank 0, at debug level.
    static std::mutex& mu = *new std::mutex;
    static auto& told = *new std::set<std::string>;
    std::lock_guard<std::mutex> lock(mu);
    if (told.insert(e.cause()).second)
      runtime::log_rank_zero(runtime::LogLevel::kDebug,
                             "xla compile cache: a program is not kept, because the plugin cannot serialize its "
                             "executable (" + e.cause() + "); later processes compile it again. On the CPU plugin, "
                             "XLA_FLAGS=--xla_cpu_experimental_xnn_fusion_type= (no XNNPACK fusions) lets every "
                             "program be kept");
  }
  return compiled;
}

Executable Client::compile_uncached(const std::string& stablehlo) const {
  static const char format[] = "mlir";
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = const_cast<char*>(stablehlo.data());  // read only by Compile
  program.code_size = stablehlo.size();
  program.format = format;
  program.format_size = sizeof format - 1;
  PJRT_Client_Compile_Args a{};
  a.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
  a.client = client_;
  a.program = &program;
  a.compile_options = kCompileOptions;
  a.compile_options_size = sizeof kCompileOptions;
  const auto start = std::chrono::steady_clock::now();
  plugin_->check(plugin_->api()->PJRT_Client_Compile(&a), "PJRT_Client_Compile");
  detail::count_compile(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return Executable(*plugin_, device_, a.executable);
}

std::map<std::string, int64_t> Client::memory_stats() const {
  std::map<std::string, int64_t> stats;
  if (!plugin_->api()->PJRT_Device_MemoryStats) return stats;
  PJRT_Device_MemoryStats_Args a{};
  a.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  a.device = device_;
  if (PJRT_Error* error = plugin_->api()->PJRT_Device_MemoryStats(&a)) {
    destroy_quietly(*plugin_, error);  // the CPU plugin, for one, has none
    return stats;
  }
  stats["bytes_in_use"] = a.bytes_in_use;
  const auto optional = [&](const char* name, int64_t value, bool is_set) {
    if (is_set) stats[name] = value;
  };
  optional("peak_bytes_in_use", a.peak_bytes_in_use, a.peak_bytes_in_use_is_set);
  optional("num_allocs", a.num_allocs, a.num_allocs_is_set);
  optional("largest_alloc_size", a.largest_alloc_size, a.largest_alloc_size_is_set);
  optional("bytes_limit", a.bytes_limit, a.bytes_limit_is_set);
  optional("bytes_reserved", a.bytes_reserved, a.bytes_reserved_is_set);
  optional("peak_bytes_reserved", a.peak_bytes_reserved, a.peak_bytes_reserved_is_set);
  optional("bytes_reservable_limit", a.bytes_reservable_limit, a.bytes_reservable_limit_is_set);
  optional("largest_free_block_bytes", a.largest_free_block_bytes, a.largest_free_block_bytes_is_set);
  optional("pool_bytes", a.pool_bytes, a.pool_bytes_is_set);
  optional("peak_pool_bytes", a.peak_pool_bytes, a.peak_pool_bytes_is_set);
  return stats;
}

Buffer Client::to_device(const void* data, ElementType type, const std::vector<int64_t>& dims) const {
  int64_t elements = 1;
  for (int64_t d : dims) elements *= d;
  const size_t bytes = element_size(type) * static_cast<size_t>(elements);
  PJRT_Client_BufferFromHostBuffer_Args a{};
  a.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  a.client = client_;
  a.data = data;
  a.type = static_cast<PJRT_Buffer_Type>(type);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  a.device = device_;
  plugin_->check(plugin_->api()->PJRT_Client_BufferFromHostBuffer(&a), "PJRT_Client_BufferFromHostBuffer");
  Buffer buffer(*plugin_, a.buffer);
  Event done(*plugin_, a.done_with_host_buffer);
  done.await("PJRT_Client_BufferFromHostBuffer");
  detail::count_to_device(static_cast<int64_t>(bytes));
  return buffer;
}

Client& process_client() {
  static const pid_t creator = ::getpid();
  static Client* client = [] {
    const PluginChoice choice = choose_plugin();
    ClientOptions options;
    if (choice.device != "CPU") options.cpu_device_count.reset();
    // A malformed value is an error naming it (it used to become 1 silently).
    options.local_world_size = std::max<int64_t>(1, runtime::env_int("LOCAL_WORLD_SIZE", 1));
    options.local_rank = std::max<int64_t>(0, runtime::env_int("LOCAL_RANK", 0));
    // Several workers on this machine: each owns one device, told to the plugin before the client
    // exists where the plugin has a way (the GPU plugin's visible devices, libtpu's variables).
    if (options.local_world_size > 1 && choice.device == "CUDA") options.visible_devices = std::vector<int64_t>{options.local_rank};
    if (options.local_world_size > 1 && choice.device == "TPU") {
      for (const auto& [name, value] : tpu_process_environment(options.local_rank, options.local_world_size,
                                                               [](const char* n) { return runtime::env_value(n); }))
        setenv(name.c_str(), value.c_str(), 0);
    }
    return new Client(Plugin::load(choice.path), options);
  }();
  if (::getpid() != creator)
    throw std::logic_error("PJRT: this process (pid " + std::to_string(::getpid()) + ") was forked from pid " +
                           std::to_string(creator) + ", which had already started its PJRT client (" +
                           client->plugin().path() + "); the plugin's threads do not survive fork, so the client "
                           "cannot be used here. Start the workers with TrainerOptions().start_method(\"spawn\"), or launch them "
                           "before the launching process uses an xla device");
  return *client;
}

}  // namespace fulgur::xla::pjrt
