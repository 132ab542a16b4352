// What the trainer may do to the paths a user names: which files it may
// replace, read or append to, and which leftovers of dead writers it may
// remove. The checks exist because `train` often runs as root: a path that
// names a device node, a FIFO or a symbolic link must never be turned into a
// regular file (or, for a FIFO, block the run forever).
//
// Rules:
//   - replaced (--save, checkpoints): the target is absent or a regular file;
//     anything else (symbolic link, device, FIFO, socket, directory) is refused.
//     The new bytes go to "<target>.tmp.<pid>" in the same directory, which is
//     renamed over the target (checkpoint.h).
//   - read (--init, checkpoints): a regular file (symbolic links followed).
//   - appended (--metrics): a regular file, or a stream (FIFO with a reader,
//     character device such as a terminal or /dev/null); block devices,
//     directories and sockets are refused.
//   - temporaries "<name>.tmp.<pid>" whose writer is gone (no such process, or
//     a process that is not this program) are removed at start.
//
// Thread-safety: the functions keep no state. The checks are made before the
// operation, so a path changed by someone else in between is not covered
// (the temporary file is still created with O_EXCL | O_NOFOLLOW).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ddprun::train {

// "" when `path` may be replaced by a rename (absent, or a regular file that
// is not a symbolic link), else why not, e.g. "is a FIFO: refusing to replace
// it". `path`'s directory is not checked.
std::string replaceTargetProblem(const std::string& path);

// "" when `path` is a regular file (after following links), else why not
// ("no such file", "is a FIFO, not a regular file", ...).
std::string regularFileProblem(const std::string& path);

// "" when `path` may be appended to as a metrics stream (absent in an existing
// directory, a regular file, a FIFO, a character device), else why not.
std::string appendTargetProblem(const std::string& path);

// Whether a "<name>.tmp.<pid>" left by process `pid` may still be written:
// the process exists and runs the same program as this one (or cannot be
// inspected). Our own pid counts as gone: nothing of ours is in flight yet
// when the leftovers are cleared.
bool writerMayBeAlive(long pid);

// Removes the regular files "<name>.tmp.<pid>" in `dir` whose <name> is
// accepted by `owned` and whose writer is gone (writerMayBeAlive false).
// Returns the names removed. A missing directory has none; a file that cannot
// be removed stays (as it would have without this).
std::vector<std::string> removeStaleTemporaries(
    const std::string& dir, const std::function<bool(const std::string&)>& owned);

}  // namespace ddprun::train
