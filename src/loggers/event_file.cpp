// SPDX-License-Identifier: Apache-2.0
#include "loggers/event_file.h"

#include "loggers/crc32c.h"
#include "loggers/protobuf_writer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>

namespace fulgur::detail {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string little_endian(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// Event fields: wall_time = 1, step = 2, file_version = 3, summary = 5.
// Summary: value = 1. Summary.Value: tag = 1, simple_value = 2, metadata = 9.
// SummaryMetadata: plugin_data = 1; PluginData: plugin_name = 1, content = 2.
std::string encode_value(const SummaryValue& v) {
  ProtobufWriter value;
  value.bytes(1, v.tag);
  if (v.simple_value) value.fixed_float(2, *v.simple_value);
  if (!v.plugin_name.empty()) {
    ProtobufWriter plugin_data;
    plugin_data.bytes(1, v.plugin_name);
    plugin_data.bytes(2, v.plugin_content);
    ProtobufWriter metadata;
    metadata.bytes(1, plugin_data.str());
    value.bytes(9, metadata.str());
  }
  return value.str();
}

}  // namespace

EventFile::EventFile(const std::string& dir) {
  static std::atomic<int> opened{0};
  std::filesystem::create_directories(dir);
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
                                         "." + host_name() + "." + std::to_string(::getpid()) + "." +
                                         std::to_string(opened++)))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error("TensorBoardLogger: cannot create " + path_);
  ProtobufWriter event;
  event.fixed_double(1, now_seconds());
  event.varint(2, 0);
  event.bytes(3, "brain.Event:2");
  write_event(event.str());
}

void EventFile::write_summary(int64_t step, const std::vector<SummaryValue>& values) {
  ProtobufWriter summary;
  for (const auto& v : values) summary.bytes(1, encode_value(v));
  ProtobufWriter event;
  event.fixed_double(1, now_seconds());
  event.varint(2, step);
  event.bytes(5, summary.str());
  write_event(event.str());
}

void EventFile::write_event(const std::string& event) {
  const std::string length = little_endian(event.size(), 8);
  out_ << length << little_endian(masked_crc32c(length), 4) << event << little_endian(masked_crc32c(event), 4);
  out_.flush();
  if (!out_) throw std::runtime_error("TensorBoardLogger: cannot write to " + path_);
}

}  // namespace fulgur::detail
