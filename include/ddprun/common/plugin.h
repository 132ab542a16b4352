// Parts of ddprun loaded at run time (dlopen): the CUDA parts of the runtime
// and of train live in shared objects that a CPU-only install does not have,
// so the programs link no CUDA library and load one only when asked.
//
// A plugin file is looked for, in order, in
//   - each directory of $DDPRUN_PLUGIN_PATH (colon-separated), then
//   - beside the running program: <bin>/../lib/ddprun (cmake --install, the
//     Debian package, the build tree), and the Python environments a wheel
//     installs into: <bin>/../lib/python3.*/{site,dist}-packages/ddprun/lib.
// Thread-safety: the functions are safe to call from any thread.
#pragma once

#include <string>
#include <vector>

namespace ddprun::plugin {

// The directories searched for plugins of a program in `binDir`, in order,
// given $DDPRUN_PLUGIN_PATH (`envPath`, may be empty) and the names of the
// Python library directories under <binDir>/../lib (`pythonDirs`, e.g.
// "python3.11", tried in the order given). Pure: touches no file.
std::vector<std::string> searchDirs(const std::string& binDir, const std::string& envPath,
                                    const std::vector<std::string>& pythonDirs);

// The result of looking for and opening one plugin.
struct Opened {
  void* symbol = nullptr;  // the entry point; null when the plugin is unusable
  std::string path;        // the file found ("" when none was found)
  std::string error;       // why it is unusable: not found, or the loader's message
};

// Looks for `file` in searchDirs(<this program's directory>, $DDPRUN_PLUGIN_PATH,
// <the python3.* directories there>), opens the first found with
// RTLD_NOW | RTLD_LOCAL (every library it needs must resolve, or it is not
// used) and returns its symbol `entry`. Never throws. The plugin stays loaded
// for the life of the process.
Opened open(const std::string& file, const std::string& entry);

}  // namespace ddprun::plugin
