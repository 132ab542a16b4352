// Parts of ddprun loaded at run time (dlopen): the CUDA parts of the runtime
// and of train live in shared objects that a CPU-only install does not have,
// so the programs link no CUDA library and load one only when asked.
//
// A plugin file is looked for, in order, in
//   - each directory of $DDPRUN_PLUGIN_PATH (colon-separated), then
//   - beside the running program: <bin>/../lib/ddprun (cmake --install, the
//     Debian package, the build tree), and the Python environments a wheel
//     installs into: <bin>/../lib/python3.*/{site,dist}-packages/ddprun/lib.
//
// A plugin is checked before any of its code runs. dlopen runs the
// constructors of the plugin and of every library it needs, so whatever can
// be checked is checked first, from the file:
//   1. Where. A directory is skipped, with a warning naming it, when it is
//      relative (it would depend on the working directory: the classic
//      LD_LIBRARY_PATH hole) or writable by others. A sticky bit does not make
//      a world-writable directory safe: it keeps others from removing or
//      renaming the files you own there, not from creating the plugin's name
//      where it is not yet, as anyone can in /tmp. The same holds for the
//      directory the file really lives in (after symbolic links), and a
//      world-writable file is skipped too. Group-writable is allowed (the
//      user-private groups of Debian's default umask 002).
//   2. What. A candidate that is not a regular file (a directory, a FIFO, a
//      device with the plugin's name) is skipped with a warning, and the
//      search goes on; the first regular file is the plugin, usable or not.
//   3. Before dlopen, the file's ELF header and dynamic symbol table are read
//      (pread, bounds checked, limits before any allocation): an ELF shared
//      object of this program's class, byte order and machine; the entry
//      point a defined global function symbol (STT_FUNC: a data symbol with
//      the name is refused, not called); and `<entry>_abi`, a 4-byte data
//      object (DDPRUN_PLUGIN_ABI below) whose value is read from the file's
//      bytes and must equal the ABI the program wants. The ABI is a symbol
//      rather than a note section because every toolchain keeps an exported
//      symbol in .dynsym with its size and type, where a note needs section
//      attributes that --gc-sections and some linkers drop, and because the
//      same symbol can be cross-checked once loaded. It is a compile-time
//      constant: no relocation applies to it and no constructor could change
//      what is read. A plugin of another build is thus refused before any of
//      its code runs. Reading needs the section headers, which every linker
//      writes and `strip` keeps.
//   4. After dlopen (RTLD_NOW | RTLD_LOCAL: every library it needs must
//      resolve): the object loaded must be the file inspected (same device and
//      inode, against a swap between check and load), the entry point must
//      resolve to a function symbol of that object (dladdr1, RTLD_DL_SYMENT),
//      and openTable checks the table's own abi field.
// Thread-safety: the functions are safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Defines the ABI marker of a plugin whose entry point is `entry`:
// `extern "C" const uint32_t <entry>_abi = abi;`, exported. Use it once, in
// the file that defines the entry point.
#define DDPRUN_PLUGIN_ABI(entry, abi)                                                    \
  extern "C" __attribute__((visibility("default"), used)) const ::uint32_t entry##_abi = \
      (abi)

namespace ddprun::plugin {

// The directories searched for plugins of a program in `binDir`, in order,
// given $DDPRUN_PLUGIN_PATH (`envPath`, may be empty) and the names of the
// Python library directories under <binDir>/../lib (`pythonDirs`, e.g.
// "python3.11", tried in the order given). Pure: touches no file.
std::vector<std::string> searchDirs(const std::string& binDir, const std::string& envPath,
                                    const std::vector<std::string>& pythonDirs);
// searchDirs for this program and $DDPRUN_PLUGIN_PATH.
std::vector<std::string> defaultSearchDirs();

// The first usable candidate for `file` in `dirs` (checks 1 and 2 above).
struct Found {
  std::string path;                   // canonical; "" when none was found
  std::vector<std::string> warnings;  // each directory or file skipped, and why
  std::string error;                  // when path is "": not installed, where looked
};
Found find(const std::vector<std::string>& dirs, const std::string& file);

// What the file says before it is loaded (check 3 above).
struct Inspection {
  bool ok = false;
  uint32_t abi = 0;   // the value of <entry>_abi (ok only)
  std::string error;  // why the file is not a plugin with that entry point
};
Inspection inspect(const std::string& path, const std::string& entry);
// The name of the ABI marker of the plugin whose entry point is `entry`.
std::string abiSymbol(const std::string& entry);

// The result of looking for and opening one plugin.
struct Opened {
  void* symbol = nullptr;  // the entry point; null when the plugin is unusable
  std::string path;        // the file found ("" when none was found)
  std::string error;       // why it is unusable: not found, refused, the loader's message
  std::vector<std::string> warnings;  // Found::warnings
};

// Looks for `file` in `dirs`, checks it (1 to 4 above, wanting ABI `abi`),
// opens it with RTLD_NOW | RTLD_LOCAL and returns its function `entry`.
// Warns of nothing itself (Opened::warnings). Never throws. The plugin stays
// loaded for the life of the process.
Opened openFrom(const std::vector<std::string>& dirs, const std::string& file,
                const std::string& entry, uint32_t abi);
// openFrom(defaultSearchDirs(), ...), with each warning logged once a process.
Opened open(const std::string& file, const std::string& entry, uint32_t abi);

// True when `error` (an Opened::error) says the plugin file was not found at
// all, as opposed to found but unusable (a library it needs, its ABI).
bool notInstalled(const std::string& error);

// A plugin whose entry point, `const Table* entry()`, returns a table of
// functions whose first member is `uint32_t abi`: the table when the plugin
// passes the checks and its table's abi is `abi` too, else null and the
// reason (a plugin of another build is refused).
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
  const Opened o = open(file, entry, abi);
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
