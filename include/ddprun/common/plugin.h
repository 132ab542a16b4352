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

#include <cstdint>
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

// True when `error` (an Opened::error) says the plugin file was not found at
// all, as opposed to found but unusable (a library it needs, its ABI).
bool notInstalled(const std::string& error);

// A plugin whose entry point, `const Table* entry()`, returns a table of
// functions whose first member is `uint32_t abi`: the table when the plugin
// opens and its abi is `abi`, else null and the reason (a plugin of another
// build is refused).
template <class Table>
struct Loaded {
  const Table* table = nullptr;
  std::string path;   // the file found ("" when none was)
  std::string error;  // why table is null
};
std::string abiMismatch(const std::string& path, uint32_t found, uint32_t wanted);
template <class Table>
Loaded<Table> openTable(const std::string& file, const std::string& entry, uint32_t abi) {
  Loaded<Table> r;
  const Opened o = open(file, entry);
  r.path = o.path;
  if (!o.symbol) {
    r.error = o.error;
    return r;
  }
  const Table* t = reinterpret_cast<const Table* (*)()>(o.symbol)();
  if (!t || t->abi != abi) {
    r.error = abiMismatch(o.path, t ? t->abi : 0, abi);
    return r;
  }
  r.table = t;
  return r;
}

}  // namespace ddprun::plugin
