// SPDX-License-Identifier: Apache-2.0
#pragma once
// fulgur's own messages on stderr, in one place.
//
// Levels: debug < info < warning < error. FULGUR_LOG_LEVEL (read on each
// message) sets the lowest level written: "debug", "info" (the default),
// "warning", "error", or "off" for nothing; another value is refused by the
// Trainer's constructor (runtime::validate_environment).
//
// Each message is one line, "fulgur: <text>\n", written with a single
// write(2), so the lines of several processes sharing stderr never mix within
// a line. Messages that only rank 0 should print (as Lightning's
// rank_zero_info) go through rank_zero(); every-rank messages name the rank
// when the job has several (WORLD_SIZE > 1). Thread safe.

#include <cstdint>
#include <string>

namespace fulgur::runtime {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Whether a message at `level` is written (an unknown FULGUR_LOG_LEVEL counts as unset).
bool log_enabled(LogLevel level);

// Written by every process that calls it: "fulgur: rank R: <message>" in a job
// of several processes, "fulgur: <message>" otherwise. The rank and world
// size are those a RankScope set; without one, the detected cluster
// environment's.
void log(LogLevel level, const std::string& message);

// Written by global rank 0 only (the launching process counts as rank 0):
// "fulgur: <message>".
void log_rank_zero(LogLevel level, const std::string& message);

// The global rank messages name: a RankScope's, else the detected cluster environment's (the
// device generator of xla devices keys itself with it, src/xla/lazy_random.cpp).
int64_t global_rank();

// Warnings that a run can meet again and again (in each stage, each epoch, each
// resume): written at warning level the first time this process asks with this
// exact text, and never again in the process, as Python's default warnings
// filter shows Lightning's rank_zero_warn once. In the workers of fulgur's
// launcher, once in the whole run of the launching process: across the ranks,
// the stages (each starts new workers) and the restarts, through a record in
// the launcher's private folder (log.cpp, shared_record_dir). Keyed by the
// whole text, so a message that names a different value is a different
// warning. Return whether this call wrote the line.
// Written by global rank 0 only (as log_rank_zero).
bool warn_rank_zero_once(const std::string& message);
// Written by whichever rank asks first (as log, naming its rank).
bool warn_once(const std::string& message);
// As warn_rank_zero_once at info level ("fulgur: <message>"): a line every stage would
// repeat, such as the cluster environment a parallel strategy reports.
bool info_rank_zero_once(const std::string& message);

// While it lives, messages take this process's rank and world size from it
// (a running stage's strategy, which holds its cluster environment) instead
// of detecting the environment again for each one. Restores the previous
// ones when it ends. Not nested across threads: one scope per running stage.
class RankScope {
 public:
  RankScope(int64_t global_rank, int64_t world_size);
  ~RankScope();
  RankScope(const RankScope&) = delete;
  RankScope& operator=(const RankScope&) = delete;

 private:
  int64_t previous_rank_;
  int64_t previous_world_size_;
};

}  // namespace fulgur::runtime
