// SPDX-License-Identifier: Apache-2.0
#pragma once
// The part of XLA's typed FFI calling convention (stablehlo.custom_call with api_version 4) that
// fulgur's host kernels (xla/host_kernels.h) use: what XLA passes a handler and what a handler
// may call back. The pinned CPU plugin ships no header for it (only pjrt_c_api.h), so these are
// fulgur's declarations of the C ABI of XLA FFI API 0.1, whose layout XLA keeps stable within a
// major version (fields are only appended). Every struct starts with its size; the handlers
// check the call frame's before reading it.

#include <cstddef>
#include <cstdint>

namespace fulgur::xla::ffi {

struct ExtensionBase {
  size_t struct_size;
  int type;  // 1: the metadata extension
  ExtensionBase* next;
};
constexpr int kMetadataExtension = 1;

struct ApiVersion {
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};
// The version these declarations follow.
constexpr int kMajor = 0, kMinor = 1;

// XLA's element types (xla::PrimitiveType) as they appear in a buffer.
enum class DataType : int { pred = 1, s8 = 2, s32 = 4, s64 = 5, f16 = 10, f32 = 11, f64 = 12, bf16 = 16 };

struct Buffer {
  size_t struct_size;
  ExtensionBase* extension_start;
  DataType dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
};

struct ByteSpan {
  const char* ptr;
  size_t len;
};
struct Scalar {
  DataType dtype;
  void* value;
};
struct Array {
  DataType dtype;
  size_t size;
  void* data;
};
enum class AttrType : int { array = 1, dictionary = 2, scalar = 3, string = 4 };

struct Args {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int* types;  // 1: a buffer
  void** args;
};
struct Rets {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int* types;
  void** rets;
};
struct Attrs {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  AttrType* types;
  ByteSpan** names;  // sorted
  void** attrs;
};

struct Error;
struct Api;

struct CallFrame {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Api* api;
  void* ctx;
  int stage;  // 0 instantiate, 1 prepare, 2 initialize, 3 execute (fulgur's handlers run at 3)
  Args args;
  Rets rets;
  Attrs attrs;
};

// A handler's answer to XLA's metadata query (a call whose extension_start is a
// MetadataExtension): its API version and traits.
struct Metadata {
  size_t struct_size;
  ApiVersion api_version;
  uint32_t traits;
};
struct MetadataExtension {
  ExtensionBase base;
  Metadata* metadata;
};

enum class ErrorCode : int { internal = 13 };
struct ErrorCreateArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* message;
  ErrorCode code;
};

// The head of XLA's function table (the calls fulgur makes; the rest follows).
struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion api_version;
  void* internal_api;
  Error* (*error_create)(ErrorCreateArgs* args);
};

}  // namespace fulgur::xla::ffi
