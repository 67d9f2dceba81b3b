// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a worker of a restarted launch needs (MultiProcessLauncherOptions::
// max_restarts): which attempt it belongs to, and the last.ckpt an earlier
// attempt of the same launch wrote, to resume from.
//
// Rank 0 of each attempt's fit records its ModelCheckpoint's folder in the
// launch's folder, with the identity (inode and modification time) of the
// last.ckpt that folder holds at that moment. On a restart, the newest
// attempt whose folder now holds a different last.ckpt (or one where there
// was none) wrote it: that file is resumed from. A last.ckpt left in the
// folder by an earlier run is never taken for this run's.

#include <cstdint>
#include <string>

namespace fulgur::detail {

// The file in a launch's folder that holds the records; a restart keeps it.
inline constexpr const char* kCheckpointFoldersFile = "checkpoint-folders";

// 0 in the first attempt of a launch and outside fulgur's workers; k in the
// k-th restart (FULGUR_RESTART_COUNT).
int64_t restart_count();

// In a worker of fulgur's launcher (else nothing): records `dirpath` as the
// folder this attempt's last.ckpt goes to. REQUIRES: global rank 0, once per
// fit, before its first save.
void record_checkpoint_folder(const std::string& dirpath);

// In a worker of fulgur's launcher: the path of the last.ckpt written during
// this launch by the newest attempt that wrote one, or "" when none did.
// REQUIRES: global rank 0 (the records are in node 0's launch folder).
std::string last_checkpoint_of_this_launch();

}  // namespace fulgur::detail
