// SPDX-License-Identifier: Apache-2.0
#include "data/idx.h"

#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur::detail {
namespace {

uint32_t be32(const unsigned char* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : " x ") + std::to_string(d);
  return out;
}

}  // namespace

IdxHeader parse_idx_header(const std::string& path, const unsigned char* head, size_t head_bytes, uint64_t file_bytes,
                           uint32_t magic, int dims) {
  const std::string where = "MNIST: " + path;
  const uint64_t need = 4 + 4 * static_cast<uint64_t>(dims);
  if (file_bytes < 4 || head_bytes < 4) {
    throw std::runtime_error(where + " is too short for an IDX file: " + std::to_string(file_bytes) +
                             " bytes, its magic number alone takes 4");
  }
  const uint32_t got = be32(head);
  if (got != magic) {
    throw std::runtime_error(where + " has magic number " + std::to_string(got) + ", expected " + std::to_string(magic) +
                             "; the file is not an IDX file of this kind");
  }
  if (file_bytes < need || head_bytes < need) {
    throw std::runtime_error(where + " is too short for its header: " + std::to_string(file_bytes) + " bytes, " +
                             std::to_string(dims) + " dimensions take " + std::to_string(need));
  }
  IdxHeader h;
  h.header_bytes = static_cast<int64_t>(need);
  h.data_bytes = 1;
  bool overflow = false;
  for (int d = 0; d < dims; ++d) {
    const uint32_t v = be32(head + 4 + 4 * d);
    if (v == 0) throw std::runtime_error(where + " has a bad header: dimension " + std::to_string(d) + " is 0");
    h.shape.push_back(v);
    overflow = overflow || __builtin_mul_overflow(h.data_bytes, static_cast<int64_t>(v), &h.data_bytes);
  }
  const uint64_t data_in_file = file_bytes - need;
  if (overflow) {
    throw std::runtime_error(where + " has a bad header: its dimensions " + shape_text(h.shape) +
                             " overflow a 64-bit size; the file has " + std::to_string(file_bytes) + " bytes");
  }
  if (static_cast<uint64_t>(h.data_bytes) > data_in_file) {
    throw std::runtime_error(where + " is truncated: its header says " + shape_text(h.shape) + " = " +
                             std::to_string(h.data_bytes) + " bytes of data after " + std::to_string(need) +
                             " bytes of header, the file has " + std::to_string(file_bytes) + " bytes");
  }
  if (static_cast<uint64_t>(h.data_bytes) < data_in_file) {
    throw std::runtime_error(where + " has " + std::to_string(data_in_file - h.data_bytes) +
                             " bytes after the data its header describes (" + shape_text(h.shape) + " = " +
                             std::to_string(h.data_bytes) + " bytes); the file has " + std::to_string(file_bytes) +
                             " bytes");
  }
  return h;
}

at::Tensor decode_idx(const std::string& path, const unsigned char* data, size_t size, uint32_t magic, int dims) {
  const IdxHeader h = parse_idx_header(path, data, size, size, magic, dims);
  auto out = torch::empty(h.shape, torch::kUInt8);
  std::memcpy(out.data_ptr<uint8_t>(), data + h.header_bytes, static_cast<size_t>(h.data_bytes));
  return out;
}

at::Tensor read_idx_file(const std::string& path, uint32_t magic, int dims, const std::string& missing_hint) {
  if (dims < 0 || dims > 8) throw std::invalid_argument("read_idx_file: dims=" + std::to_string(dims) + " is outside [0, 8]");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("MNIST: cannot open " + path + missing_hint);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw std::runtime_error("MNIST: " + path + " is not a regular file");
  const uint64_t file_bytes = fs::file_size(path, ec);
  if (ec) throw std::runtime_error("MNIST: cannot read the size of " + path + ": " + ec.message());
  unsigned char head[4 + 4 * 8] = {};
  const size_t head_bytes = static_cast<size_t>(std::min<uint64_t>(file_bytes, 4 + 4 * static_cast<uint64_t>(dims)));
  in.read(reinterpret_cast<char*>(head), static_cast<std::streamsize>(head_bytes));
  const IdxHeader h = parse_idx_header(path, head, static_cast<size_t>(in.gcount()), file_bytes, magic, dims);
  auto out = torch::empty(h.shape, torch::kUInt8);
  in.read(reinterpret_cast<char*>(out.data_ptr<uint8_t>()), h.data_bytes);
  if (in.gcount() != h.data_bytes) {
    throw std::runtime_error("MNIST: " + path + " is truncated: its header says " + std::to_string(h.data_bytes) +
                             " bytes of data, " + std::to_string(in.gcount()) + " could be read (did the file shrink?)");
  }
  return out;
}

}  // namespace fulgur::detail
