// SPDX-License-Identifier: Apache-2.0
#include "launchers/restarts.h"

#include "launchers/worker_env.h"
#include "runtime/env.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace fulgur::detail {
namespace {

// Which file a path names now: inode and modification time in nanoseconds,
// "none" when there is no file. A checkpoint save renames a new file into
// place, so every save changes it.
std::string identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "none";
  const long long mtime = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  return std::to_string(static_cast<unsigned long long>(st.st_ino)) + ":" + std::to_string(mtime);
}

std::string records_path() {
  const std::string dir = runtime::env_string(kLaunchDirEnv);
  return dir.empty() ? "" : dir + "/" + kCheckpointFoldersFile;
}

}  // namespace

int64_t restart_count() {
  return runtime::env_string(kWorkerEnv) == "1" ? runtime::env_int(kRestartCountEnv, 0) : 0;
}

void record_checkpoint_folder(const std::string& dirpath) {
  const std::string records = records_path();
  if (records.empty() || dirpath.empty()) return;
  // One line per fit: "<identity of its last.ckpt now>\t<folder>".
  std::ofstream(records, std::ios::app) << identity(dirpath + "/last.ckpt") << "\t" << dirpath << "\n";
}

std::string last_checkpoint_of_this_launch() {
  const std::string records = records_path();
  if (records.empty()) return "";
  std::ifstream in(records);
  std::vector<std::pair<std::string, std::string>> lines;  // identity, folder
  for (std::string line; std::getline(in, line);) {
    const auto tab = line.find('\t');
    if (tab != std::string::npos) lines.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const std::string last = it->second + "/last.ckpt";
    const std::string now = identity(last);
    if (now != "none" && now != it->first) return last;
  }
  return "";
}

}  // namespace fulgur::detail
