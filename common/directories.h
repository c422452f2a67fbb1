// Making directories with an error a user can act on; shared by the coordinator (job
// directories) and the worker (checkpoint directories).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dtrain {

// mkdir -p; FAILED_PRECONDITION "cannot create <what> '<path>': <the system's reason>" when it
// cannot be made.
absl::Status MakeDirectories(const std::string& path, const std::string& what = "directory");

// A directory only this process's user may use, for state that later reads trust (the
// coordinator's state, the worker's artifact cache and job files): made as above, then
// FAILED_PRECONDITION when it (or what a link there points to) belongs to another user than
// this one or root, who could plant files in it, or is root's and writable by every user;
// narrowed to 0700 when it is this user's and others may read or write it.
absl::Status MakePrivateDirectory(const std::string& path, const std::string& what = "directory");

// Where a daemon keeps what must last (the coordinator's database and stored files, a worker's
// job files) when no flag names a directory: systemd's $STATE_DIRECTORY (a unit's
// StateDirectory=; the first when it lists several), /var/lib/dtrain for root, else
// $XDG_STATE_HOME/dtrain or ~/.local/state/dtrain. Never a path every user can predict and
// create first, as one in /tmp would be.
std::string DefaultStateDirectory();
// The same for what can be fetched again (a worker's artifact cache): $CACHE_DIRECTORY,
// /var/cache/dtrain for root, else $XDG_CACHE_HOME/dtrain or ~/.cache/dtrain.
std::string DefaultCacheDirectory();

}  // namespace dtrain
