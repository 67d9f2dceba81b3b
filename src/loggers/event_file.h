// SPDX-License-Identifier: Apache-2.0
#pragma once
// A TensorBoard event file: TFRecord records (length, masked CRC-32C of the
// length, an Event message, masked CRC-32C of the message), the first one the
// file_version event "brain.Event:2".

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fulgur::detail {

// One Summary.Value: a scalar (simple_value) or plugin data (metadata only).
struct SummaryValue {
  std::string tag;
  std::optional<float> simple_value;
  std::string plugin_name;     // with plugin_content: SummaryMetadata.plugin_data
  std::string plugin_content;  // serialized plugin message
};

// Seconds since the Unix epoch, as Event.wall_time holds them.
double now_seconds();

// Writes one event file. Not thread safe.
class EventFile {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>.<n> (n counts
  // the files this process opened) and writes the file_version event.
  // Throws std::runtime_error naming the file if it cannot be written.
  explicit EventFile(const std::string& dir);
  // Writes an Event at `step` holding a Summary of `values`, and flushes it
  // to the file.
  void write_summary(int64_t step, const std::vector<SummaryValue>& values);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace fulgur::detail
