#pragma once
// fulgur's own messages on stderr, in one place.
//
// Levels: debug < info < warning < error. FULGUR_LOG_LEVEL (read on each
// message) sets the lowest level written: "debug", "info" (the default),
// "warning", "error", or "off" for nothing.
//
// Each message is one line, "fulgur: <text>\n", written with a single
// write(2), so the lines of several processes sharing stderr never mix within
// a line. Messages that only rank 0 should print (as Lightning's
// rank_zero_info) go through rank_zero(); every-rank messages name the rank
// when the job has several (WORLD_SIZE > 1). Thread safe.

#include <string>

namespace fulgur::runtime {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Throws std::invalid_argument naming FULGUR_LOG_LEVEL and the valid values
// when it holds another (the Trainer's constructor calls it).
void check_log_level();

// Whether a message at `level` is written (an unknown FULGUR_LOG_LEVEL counts as unset).
bool log_enabled(LogLevel level);

// Written by every process that calls it: "fulgur: rank R: <message>" in a job
// of several processes (the detected cluster environment's world size and
// rank), "fulgur: <message>" otherwise.
void log(LogLevel level, const std::string& message);

// Written by global rank 0 only (the launching process counts as rank 0):
// "fulgur: <message>".
void log_rank_zero(LogLevel level, const std::string& message);

}  // namespace fulgur::runtime
