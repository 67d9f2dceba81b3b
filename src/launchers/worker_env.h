#pragma once
// The variables fulgur's MultiProcessLauncher puts in each worker's
// environment for itself and for LightningEnvironment, which reads them in
// the worker; nothing else reads them. (The torchrun names it also sets,
// RANK, WORLD_SIZE, MASTER_ADDR and the like, are every environment's.)

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

}  // namespace fulgur::detail
