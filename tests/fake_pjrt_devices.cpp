// SPDX-License-Identifier: Apache-2.0
// A PJRT plugin with no compiler: a client whose addressable devices are FAKE_PJRT_DEVICES
// (default 4) devices with ids 0..N-1, or, when the `visible_devices` create option (an int64
// list, as the GPU plugin takes it) is given, only those. Enough for fulgur's Client to start,
// pick its device and report it; compiling or running anything fails. For the one-device-per-rank
// tests in test_pjrt.

#include <pjrt_c_api.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct PJRT_Error {
  std::string message;
};
struct PJRT_DeviceDescription {
  int id;
};
struct PJRT_Device {
  PJRT_DeviceDescription description;
};
struct PJRT_Client {
  std::vector<PJRT_Device> devices;
  std::vector<PJRT_Device*> pointers;
};

namespace {

void error_destroy(PJRT_Error_Destroy_Args* a) { delete a->error; }

void error_message(PJRT_Error_Message_Args* a) {
  a->message = a->error->message.data();
  a->message_size = a->error->message.size();
}

PJRT_Error* error_code(PJRT_Error_GetCode_Args* a) {
  a->code = PJRT_Error_Code_INVALID_ARGUMENT;
  return nullptr;
}

PJRT_Error* initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }

PJRT_Error* attributes(PJRT_Plugin_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  return nullptr;
}

PJRT_Error* client_create(PJRT_Client_Create_Args* a) {
  const char* n = std::getenv("FAKE_PJRT_DEVICES");
  const int count = n ? std::atoi(n) : 4;
  std::vector<int> ids;
  for (int i = 0; i < count; ++i) ids.push_back(i);
  for (size_t k = 0; k < a->num_options; ++k) {
    const PJRT_NamedValue& v = a->create_options[k];
    const std::string name(v.name, v.name_size);
    if (name != "visible_devices") return new PJRT_Error{"fake plugin: unknown create option " + name};
    if (v.type != PJRT_NamedValue_kInt64List) return new PJRT_Error{"fake plugin: visible_devices is not an int64 list"};
    ids.clear();
    for (size_t i = 0; i < v.value_size; ++i) {
      if (v.int64_array_value[i] < 0 || v.int64_array_value[i] >= count)
        return new PJRT_Error{"fake plugin: visible device " + std::to_string(v.int64_array_value[i]) + " does not exist"};
      ids.push_back(static_cast<int>(v.int64_array_value[i]));
    }
  }
  auto* c = new PJRT_Client;
  for (int id : ids) c->devices.push_back(PJRT_Device{PJRT_DeviceDescription{id}});
  for (auto& d : c->devices) c->pointers.push_back(&d);
  a->client = c;
  return nullptr;
}

PJRT_Error* client_destroy(PJRT_Client_Destroy_Args* a) {
  delete a->client;
  return nullptr;
}

PJRT_Error* platform_name(PJRT_Client_PlatformName_Args* a) {
  static const char name[] = "fake";
  a->platform_name = name;
  a->platform_name_size = sizeof name - 1;
  return nullptr;
}

PJRT_Error* addressable_devices(PJRT_Client_AddressableDevices_Args* a) {
  a->addressable_devices = a->client->pointers.data();
  a->num_addressable_devices = a->client->pointers.size();
  return nullptr;
}

PJRT_Error* get_description(PJRT_Device_GetDescription_Args* a) {
  a->device_description = &a->device->description;
  return nullptr;
}

PJRT_Error* description_id(PJRT_DeviceDescription_Id_Args* a) {
  a->id = a->device_description->id;
  return nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = [] {
    PJRT_Api a{};
    a.struct_size = PJRT_Api_STRUCT_SIZE;
    a.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    a.pjrt_api_version.major_version = PJRT_API_MAJOR;
    a.pjrt_api_version.minor_version = PJRT_API_MINOR;
    a.PJRT_Error_Destroy = error_destroy;
    a.PJRT_Error_Message = error_message;
    a.PJRT_Error_GetCode = error_code;
    a.PJRT_Plugin_Initialize = initialize;
    a.PJRT_Plugin_Attributes = attributes;
    a.PJRT_Client_Create = client_create;
    a.PJRT_Client_Destroy = client_destroy;
    a.PJRT_Client_PlatformName = platform_name;
    a.PJRT_Client_AddressableDevices = addressable_devices;
    a.PJRT_Device_GetDescription = get_description;
    a.PJRT_DeviceDescription_Id = description_id;
    return a;
  }();
  return &api;
}
