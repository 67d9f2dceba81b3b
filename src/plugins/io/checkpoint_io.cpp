// SPDX-License-Identifier: Apache-2.0
#include <fulgur/plugins/io/checkpoint_io.h>

#include "serialize/tensor_tree.h"
#include "serialize/torch_archive.h"

#include <fulgur/serialization_error.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

constexpr const char* kTempMarker = ".tmp-";

// A save of `target` that failed at `step` (with errno set): the file at
// `target`, if any, is still the one from before.
[[noreturn]] void fail_save(const std::string& target, const std::string& step) {
  throw std::runtime_error("checkpoint: cannot save " + target + ": " + step + " failed: " + std::strerror(errno) +
                           "; " + target + " is unchanged");
}

void write_all(int fd, const char* data, size_t size, const std::string& target, const std::string& tmp) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_save(target, "writing its temporary " + tmp);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

c10::IValue to_cpu(const c10::IValue& value) {
  return detail::map_tensors(value, [](const at::Tensor& t) { return t.to(torch::kCPU); });
}

void TorchCheckpointIO::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                        const StorageOptions& /*storage_options*/) {
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(checkpoint));
  const fs::path target(path);
  const fs::path dir = target.parent_path();
  if (!dir.empty()) fs::create_directories(dir);
  std::random_device rd;
  const fs::path tmp = dir / ("." + target.filename().string() + kTempMarker + std::to_string(::getpid()) + "-" +
                              std::to_string(rd()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail_save(path, "creating its temporary " + tmp.string());
  try {
    write_all(fd, bytes.data(), bytes.size(), path, tmp.string());
    if (::fsync(fd) != 0) fail_save(path, "fsync of its temporary " + tmp.string());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail_save(path, "renaming its temporary " + tmp.string() + " to it");
  }
  fsync_dir(dir);
}

Checkpoint TorchCheckpointIO::load_checkpoint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("checkpoint " + path + " does not exist or cannot be read: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error("checkpoint " + path + " is not a regular file");
  }
  // The file's own size bounds every allocation of the reader.
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("checkpoint " + path + ": read failed after " + std::to_string(done) + " bytes");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  const c10::IValue value = detail::load_torch_archive(bytes.data(), bytes.size(), "checkpoint " + path);
  return detail::as_str_dict(value, "checkpoint " + path + " (its top level)");
}

void TorchCheckpointIO::remove_checkpoint(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

int TorchCheckpointIO::remove_stale_temporaries(const std::string& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return 0;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.rfind(kTempMarker);
    if (name.empty() || name[0] != '.' || at == std::string::npos) continue;
    // ".<name>.tmp-<pid>-<nonce>": keep files of a writer that is still alive.
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + at + std::strlen(kTempMarker)));
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) == 0) continue;
    if (fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

void XLACheckpointIO::save_checkpoint(const Checkpoint& checkpoint, const std::string& path,
                                      const StorageOptions& storage_options) {
  if (!storage_options.empty()) {
    throw std::invalid_argument("XLACheckpointIO::save_checkpoint: storage_options are not supported (got " +
                                std::to_string(storage_options.size()) + " entries, first '" +
                                storage_options.begin()->first + "'); pass none");
  }
  auto cpu = c10::impl::toTypedDict<std::string, c10::IValue>(to_cpu(c10::IValue(checkpoint)).toGenericDict());
  TorchCheckpointIO::save_checkpoint(cpu, path);
}

}  // namespace fulgur
