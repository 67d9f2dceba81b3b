// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt/plugin.h"

#include <pjrt_c_api.h>

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>

// The pinned CPU plugin implements API 0.81; a header older than the plugin would make
// argument structs the plugin refuses as too small.
static_assert(PJRT_API_MAJOR == 0 && PJRT_API_MINOR >= 81, "pjrt_c_api.h older than the pinned plugin (0.81)");

namespace fulgur::xla::pjrt {
namespace {

std::string error_code_name(PJRT_Error_Code code) {
  static const char* const names[] = {
      "OK",        "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT",    "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS",    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",  "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",      "UNIMPLEMENTED",     "INTERNAL",            "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const auto i = static_cast<size_t>(code);
  return i < std::size(names) ? names[i] : "code " + std::to_string(i);
}

// Where the function table must reach for fulgur's calls: the end of the last entry used.
constexpr size_t kApiFieldsUsed = [] {
  size_t end = 0;
  for (size_t e : {PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Error_Destroy), PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Error_Message),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Error_GetCode), PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Plugin_Initialize),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Plugin_Attributes), PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Event_Destroy),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Event_Await), PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_Create),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_Destroy), PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_PlatformName),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_AddressableDevices),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Device_GetDescription),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_DeviceDescription_Id),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_Compile),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_BufferFromHostBuffer),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_LoadedExecutable_Destroy),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_LoadedExecutable_GetExecutable),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_LoadedExecutable_Execute),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Executable_Destroy),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Executable_NumOutputs),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Buffer_Destroy), PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Buffer_ElementType),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Buffer_Dimensions),
                   PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Buffer_ToHostBuffer)})
    end = e > end ? e : end;
  return end;
}();

// PJRT's FFI extension (PJRT_Extension_Type_FFI, pjrt_c_api_ffi_extension.h in XLA, a header the
// plugin does not ship): the part fulgur calls. The plugin checks the arguments' struct_size.
struct FfiRegisterHandlerArgs {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};
constexpr size_t kFfiRegisterHandlerArgsSize = offsetof(FfiRegisterHandlerArgs, traits) + sizeof(uint32_t);
struct FfiExtension {
  PJRT_Extension_Base base;
  void* type_register;
  void* user_data_add;
  PJRT_Error* (*register_handler)(FfiRegisterHandlerArgs* args);
};

const FfiExtension* ffi_extension(const PJRT_Api* api) {
  for (const PJRT_Extension_Base* e = api->extension_start; e; e = e->next)
    if (e->type == PJRT_Extension_Type_FFI && e->struct_size >= sizeof(FfiExtension))
      return reinterpret_cast<const FfiExtension*>(e);
  return nullptr;
}

std::string attribute_text(const PJRT_NamedValue& v) {
  switch (v.type) {
    case PJRT_NamedValue_kString: return std::string(v.string_value, v.value_size);
    case PJRT_NamedValue_kInt64: return std::to_string(v.int64_value);
    case PJRT_NamedValue_kInt64List: {
      std::string s;
      for (size_t i = 0; i < v.value_size; ++i) s += (i ? "." : "") + std::to_string(v.int64_array_value[i]);
      return s;
    }
    case PJRT_NamedValue_kFloat: return std::to_string(v.float_value);
    case PJRT_NamedValue_kBool: return v.bool_value ? "true" : "false";
  }
  return "?";
}

}  // namespace

PjrtError::PjrtError(std::string call, std::string plugin, std::string cause)
    : std::runtime_error(call + " failed for PJRT plugin " + plugin + ": " + cause),
      call_(std::move(call)),
      plugin_(std::move(plugin)),
      cause_(std::move(cause)) {}

void Plugin::check(PJRT_Error* error, const char* call) const {
  if (!error) return;
  auto destroy = [this](PJRT_Error* e) {
    PJRT_Error_Destroy_Args d{};
    d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
    d.error = e;
    api_->PJRT_Error_Destroy(&d);
  };
  PJRT_Error_Message_Args m{};
  m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  m.error = error;
  api_->PJRT_Error_Message(&m);
  const std::string message(m.message, m.message_size);
  PJRT_Error_GetCode_Args c{};
  c.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE;
  c.error = error;
  std::string code = "unknown code";
  if (PJRT_Error* code_error = api_->PJRT_Error_GetCode(&c))
    destroy(code_error);
  else
    code = error_code_name(c.code);
  destroy(error);
  throw PjrtError(call, path_, code + ": " + message);
}

bool Plugin::can_register_ffi_handlers() const {
  const FfiExtension* ffi = ffi_extension(api_);
  return ffi && ffi->register_handler;
}

void Plugin::register_ffi_handler(const std::string& name, void* handler, const std::string& platform) const {
  const FfiExtension* ffi = ffi_extension(api_);
  if (!ffi || !ffi->register_handler)
    throw PjrtError("PJRT_FFI_Register_Handler(" + name + ")", path_,
                    "the plugin has no FFI extension with handler registration");
  FfiRegisterHandlerArgs a{};
  a.struct_size = kFfiRegisterHandlerArgsSize;
  a.target_name = name.data();
  a.target_name_size = name.size();
  a.handler = handler;
  a.platform_name = platform.data();
  a.platform_name_size = platform.size();
  check(ffi->register_handler(&a), ("PJRT_FFI_Register_Handler(" + name + ")").c_str());
}

Plugin::Plugin(std::string path, const PJRT_Api* api) : path_(std::move(path)), api_(api) {
  major_ = api->pjrt_api_version.major_version;
  minor_ = api->pjrt_api_version.minor_version;
  if (major_ != PJRT_API_MAJOR)
    throw PjrtError("GetPjrtApi", path_,
                    "the plugin implements PJRT C API " + std::to_string(major_) + "." + std::to_string(minor_) +
                        ", fulgur is built against " + std::to_string(PJRT_API_MAJOR) + "." +
                        std::to_string(PJRT_API_MINOR) + " and major versions must be equal");
  if (api->struct_size < kApiFieldsUsed)
    throw PjrtError("GetPjrtApi", path_,
                    "the plugin's function table has " + std::to_string(api->struct_size) +
                        " bytes, fulgur needs " + std::to_string(kApiFieldsUsed) + " (plugin API " +
                        std::to_string(major_) + "." + std::to_string(minor_) + " is too old)");
  PJRT_Plugin_Initialize_Args init{};
  init.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE;
  check(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");
  PJRT_Plugin_Attributes_Args attrs{};
  attrs.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE;
  check(api->PJRT_Plugin_Attributes(&attrs), "PJRT_Plugin_Attributes");
  for (size_t i = 0; i < attrs.num_attributes; ++i) {
    const PJRT_NamedValue& v = attrs.attributes[i];
    attributes_[std::string(v.name, v.name_size)] = attribute_text(v);
  }
}

const Plugin& Plugin::load(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Plugin>> loaded;  // never unloaded
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;

  // XLA writes an INFO line to stderr at every client creation; like torch_xla, keep its log
  // to warnings and errors unless the user chose a level.
  setenv("TF_CPP_MIN_LOG_LEVEL", "1", /*overwrite=*/0);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw PjrtError("loading", path, "no such file (set PJRT_LIBRARY_PATH or PJRT_DEVICE to choose a plugin)");
  if (!S_ISREG(st.st_mode)) throw PjrtError("loading", path, "not a regular file");
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw PjrtError("dlopen", path,
                    std::string(dlerror()) + " (not a shared library, or one that cannot load here)");
  using GetPjrtApi = const PJRT_Api* (*)();
  dlerror();
  auto get_api = reinterpret_cast<GetPjrtApi>(dlsym(handle, "GetPjrtApi"));
  if (!get_api) {
    dlclose(handle);
    throw PjrtError("dlsym(GetPjrtApi)", path, "the library has no GetPjrtApi symbol, so it is not a PJRT plugin");
  }
  const PJRT_Api* api = get_api();
  if (!api) {
    dlclose(handle);
    throw PjrtError("GetPjrtApi", path, "returned no function table");
  }
  // The plugin may already have started threads when a check fails, so a handle that got this
  // far stays open.
  std::unique_ptr<Plugin> plugin(new Plugin(path, api));
  return *loaded.emplace(path, std::move(plugin)).first->second;
}

}  // namespace fulgur::xla::pjrt
