// Private to the Reporter: pseudo-terminals for workers whose console is a
// terminal, so that isatty() is true for them as under torchrun.
#pragma once

#include "ddprun/common/fd.h"

namespace ddprun::agent::detail {

struct PtyPair {
  UniqueFd master;  // the agent reads the worker's output here
  UniqueFd slave;   // the worker's stdout/stderr (not a controlling terminal)
};

// Opens a pseudo-terminal whose slave passes bytes on unchanged (no output
// processing: '\n' stays '\n', the console's own terminal translates) and
// has the window size of `console` when that is a terminal. Both ends are
// close-on-exec. Throws IoError.
PtyPair openPty(int console);

}  // namespace ddprun::agent::detail
