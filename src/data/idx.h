// SPDX-License-Identifier: Apache-2.0
#pragma once
// The IDX format of MNIST's files: a big-endian magic number (0, 0, type,
// number of dimensions), one big-endian uint32 per dimension, then the data,
// one byte per element. Every size is checked against the file's length, in
// overflow-safe arithmetic, before anything is allocated.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fulgur::detail {

struct IdxHeader {
  std::vector<int64_t> shape;
  int64_t header_bytes = 0;  // the magic number and the dimension sizes
  int64_t data_bytes = 0;    // the product of the shape
};

// Checks the first `head_bytes` bytes of an IDX file of `file_bytes` bytes in
// all: the magic number, `dims` non-zero dimensions, and a data part of
// exactly the size they give. Throws std::runtime_error naming `path` (and
// the dimensions and the file size, where they are the cause).
IdxHeader parse_idx_header(const std::string& path, const unsigned char* head, size_t head_bytes, uint64_t file_bytes,
                           uint32_t magic, int dims);

// An IDX file held in memory, as a uint8 tensor of its header's shape.
at::Tensor decode_idx(const std::string& path, const unsigned char* data, size_t size, uint32_t magic, int dims);

// Reads the IDX file `path`; `missing_hint` is added to the error when the
// file cannot be opened.
at::Tensor read_idx_file(const std::string& path, uint32_t magic, int dims, const std::string& missing_hint);

}  // namespace fulgur::detail
