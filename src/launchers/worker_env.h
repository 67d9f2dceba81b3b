// SPDX-License-Identifier: Apache-2.0
#pragma once
// The variables fulgur's MultiProcessLauncher puts in each worker's
// environment for itself and for LightningEnvironment, which reads them in
// the worker; besides them only the log reads kWorkerEnv and kLaunchDirEnv, to
// find the record of messages shown once (runtime/log.cpp). (The torchrun names
// it also sets, RANK, WORLD_SIZE, MASTER_ADDR and the like, are every
// environment's.)

#include <cstdint>
#include <string>

namespace fulgur::detail {

// "1" in a worker of fulgur's launcher.
inline constexpr const char* kWorkerEnv = "FULGUR_WORKER";
// The launch's private folder (results, error records).
inline constexpr const char* kLaunchDirEnv = "FULGUR_LAUNCH_DIR";
// Which launch of the parent this is (0, 1, ...): a spawned worker replays the earlier ones.
inline constexpr const char* kLaunchIndexEnv = "FULGUR_LAUNCH_INDEX";
// One node: the path of the launch's FileStore.
inline constexpr const char* kStoreEnv = "FULGUR_STORE";
// Several nodes: "1" when node 0's launcher serves the TCP store, with keys under launch-<index>/.
inline constexpr const char* kParentStoreEnv = "FULGUR_PARENT_STORE";
// Which attempt of the launch the worker belongs to: "0", then "k" on the k-th
// restart (MultiProcessLauncherOptions::max_restarts).
inline constexpr const char* kRestartCountEnv = "FULGUR_RESTART_COUNT";

// Where launch `index`, attempt `attempt`, keeps its keys in node 0's store
// across nodes: the workers' rendezvous and the launchers' failure record.
// Each attempt has keys of its own, so that a restart never meets the failed
// attempt's keys.
inline std::string launch_store_prefix(int64_t index, int64_t attempt) {
  std::string prefix = "launch-" + std::to_string(index);
  if (attempt > 0) prefix += "/attempt-" + std::to_string(attempt);
  return prefix;
}

}  // namespace fulgur::detail
