#include "ddprun/common/plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "ddprun/build_id.h"  // generated: cmake/build_id.cmake
#include "ddprun/common/fd.h"
#include "ddprun/common/log.h"
#include "ddprun/common/strings.h"

namespace ddprun::plugin {

namespace fs = std::filesystem;

namespace {
constexpr const char* kNotInstalled = " is not installed";
}  // namespace

bool notInstalled(const std::string& error) {
  return error.find(kNotInstalled) != std::string::npos;
}

static_assert(sizeof(DDPRUN_BUILD_ID) == kBuildIdSize, "cmake/build_id.cmake: 32 hex digits");

const char* buildId() { return DDPRUN_BUILD_ID; }

std::string buildIdMismatch(const std::string& path, const std::string& found,
                            const std::string& wanted) {
  return path + " is from another ddprun build (plugin build id " +
         (found.empty() ? std::string("none") : found) + ", this program's is " + wanted +
         "): install the program and its plugins from the same build (reinstall "
         "ddprun)";
}

std::string tableBuildId(const char* id) {
  return id ? std::string(id, strnlen(id, kBuildIdSize - 1)) : std::string();
}

std::string buildIdSymbol(const std::string& entry) { return entry + "_build_id"; }

std::vector<std::string> searchDirs(const std::string& binDir, const std::string& envPath,
                                    const std::vector<std::string>& pythonDirs) {
  std::vector<std::string> dirs;
  for (const auto& d : str::split(envPath, ':'))
    if (!d.empty()) dirs.push_back(d);
  if (binDir.empty()) return dirs;
  const std::string lib = binDir + "/../lib";
  dirs.push_back(lib + "/ddprun");
  for (const auto& py : pythonDirs)
    for (const char* pkgs : {"site-packages", "dist-packages"})
      dirs.push_back(lib + "/" + py + "/" + pkgs + "/ddprun/lib");
  return dirs;
}

namespace {

std::string programDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// "python3.11", "python3.9", ...: newest first, so that a venv upgraded in
// place prefers its current interpreter's directory.
std::vector<std::string> pythonDirsUnder(const std::string& lib) {
  std::vector<std::pair<int, std::string>> found;
  if (DIR* d = ::opendir(lib.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      int minor = 0;
      if (name.rfind("python3.", 0) == 0 && str::parseInt(name.substr(8), minor, 0, 1000))
        found.emplace_back(minor, name);
    }
    ::closedir(d);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> names;
  for (auto& f : found) names.push_back(std::move(f.second));
  return names;
}

}  // namespace

std::vector<std::string> defaultSearchDirs() {
  const std::string bin = programDir();
  const char* env = std::getenv("DDPRUN_PLUGIN_PATH");
  return searchDirs(bin, env ? env : "", pythonDirsUnder(bin + "/../lib"));
}

// ---------------------------------------------------------------- find

namespace {

std::string octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// Why plugins in directory `dir` must not be used ("" when they may).
std::string unsafeDirectory(const std::string& dir, const struct stat& st) {
  if (!(st.st_mode & S_IWOTH)) return "";
  return "plugin directory " + dir + " is writable by every user (mode " +
         octal(st.st_mode) +
         (st.st_mode & S_ISVTX
              ? ", sticky: others still can create a file with the plugin's name"
              : "") +
         "): not searched; remove the others' write permission (chmod o-w " + dir +
         ") or put the plugins elsewhere";
}

// Why candidate `path` (a regular file, `st`, canonically `real`) is skipped.
std::string unsafeCandidate(const std::string& path, const struct stat& st,
                            const std::string& real, const std::string& dirReal) {
  if (st.st_mode & S_IWOTH)
    return "plugin " + path + " is writable by every user (mode " + octal(st.st_mode) +
           "): not used; chmod o-w " + real;
  const std::string realDir = fs::path(real).parent_path().string();
  struct stat ds {};
  if (realDir != dirReal && ::stat(realDir.c_str(), &ds) == 0) {
    const std::string why = unsafeDirectory(realDir, ds);
    if (!why.empty()) return path + " links to " + real + ", and " + why;
  }
  return "";
}

// The candidate `dir`/`file`: its canonical path, or "" (and maybe a warning).
std::string candidate(const std::string& dir, const std::string& file,
                      std::vector<std::string>& warnings) {
  if (dir.front() != '/') {
    warnings.push_back("plugin directory \"" + dir +
                       "\" is relative (it would depend on the working directory): not "
                       "searched; give DDPRUN_PLUGIN_PATH absolute directories");
    return "";
  }
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0) return "";  // no such directory: nothing to say
  if (!S_ISDIR(ds.st_mode)) {
    warnings.push_back("plugin directory " + dir + " is " + fileTypeName(ds.st_mode) +
                       ", not a directory: not searched");
    return "";
  }
  if (std::string why = unsafeDirectory(dir, ds); !why.empty()) {
    warnings.push_back(std::move(why));
    return "";
  }
  const std::string path = dir + "/" + file;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR)
      warnings.push_back("plugin " + path + ": " + std::strerror(errno) + ": skipped");
    return "";
  }
  if (!S_ISREG(st.st_mode)) {
    warnings.push_back(path + " is " + fileTypeName(st.st_mode) +
                       ", not a plugin file: skipped");
    return "";
  }
  std::error_code ec, dirEc;
  const std::string real = fs::canonical(path, ec).string();
  const std::string dirReal = fs::canonical(dir, dirEc).string();
  if (ec || dirEc) return "";  // removed meanwhile
  if (std::string why = unsafeCandidate(path, st, real, dirReal); !why.empty()) {
    warnings.push_back(std::move(why));
    return "";
  }
  return real;
}

}  // namespace

Found find(const std::vector<std::string>& dirs, const std::string& file) {
  Found r;
  for (const auto& d : dirs) {
    if (d.empty()) continue;
    r.path = candidate(d, file, r.warnings);
    if (!r.path.empty()) return r;
  }
  r.error = file + kNotInstalled + " (looked in " + str::join(dirs, ", ") + ")";
  if (!r.warnings.empty()) r.error += "; skipped: " + str::join(r.warnings, "; ");
  return r;
}

// ---------------------------------------------------------------- inspect

namespace {

#if defined(__x86_64__)
constexpr int kMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kMachine = EM_AARCH64;
#else
constexpr int kMachine = -1;  // not checked: the loader will say
#endif
constexpr unsigned char kClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kByteOrder =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
// Limits checked before allocating: ddprun's plugins export a few hundred
// symbols (a few KiB of table); 64 MiB is far beyond any real plugin.
constexpr uint64_t kMaxTableBytes = 64ull << 20;
constexpr uint32_t kMaxSections = 65535;

using Ehdr = ElfW(Ehdr);
using Shdr = ElfW(Shdr);
using Sym = ElfW(Sym);

bool readAt(int fd, uint64_t offset, size_t len, void* out) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::pread(fd, static_cast<char*>(out) + done, len - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// The file's sections, read through `fd` (size `size`), each range checked.
class ElfFile {
 public:
  ElfFile(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}

  // "" when the header is that of a shared object this program can load.
  std::string readHeader() {
    if (size_ < sizeof(Ehdr) || !readAt(fd_, 0, sizeof(Ehdr), &eh_) ||
        std::memcmp(eh_.e_ident, ELFMAG, SELFMAG) != 0)
      return path_ + " is not an ELF file";
    if (eh_.e_ident[EI_CLASS] != kClass)
      return path_ + " is a " + (eh_.e_ident[EI_CLASS] == ELFCLASS32 ? "32" : "64") +
             "-bit ELF file; this program is " + (kClass == ELFCLASS32 ? "32" : "64") +
             "-bit";
    if (eh_.e_ident[EI_DATA] != kByteOrder) return path_ + " is of the other byte order";
    if (eh_.e_type != ET_DYN) return path_ + " is an ELF file but not a shared object";
    if (kMachine >= 0 && eh_.e_machine != kMachine)
      return path_ + " is for another machine (ELF e_machine " +
             std::to_string(eh_.e_machine) + ", this program's is " +
             std::to_string(kMachine) + ")";
    if (eh_.e_shoff == 0 || eh_.e_shnum == 0 || eh_.e_shentsize != sizeof(Shdr) ||
        eh_.e_shnum > kMaxSections ||
        !inFile(eh_.e_shoff, uint64_t{eh_.e_shnum} * sizeof(Shdr)))
      return path_ + " has no readable section headers";
    sections_.resize(eh_.e_shnum);
    if (!readAt(fd_, eh_.e_shoff, sections_.size() * sizeof(Shdr), sections_.data()))
      return path_ + " could not be read";
    return "";
  }

  // Reads the dynamic symbol table and its strings; "" when done.
  std::string readDynamicSymbols() {
    const Shdr* dynsym = nullptr;
    for (const Shdr& s : sections_)
      if (s.sh_type == SHT_DYNSYM) dynsym = &s;
    if (!dynsym || dynsym->sh_entsize != sizeof(Sym) ||
        dynsym->sh_link >= sections_.size())
      return path_ + " has no dynamic symbol table (it exports nothing)";
    const Shdr& strtab = sections_[dynsym->sh_link];
    if (dynsym->sh_size > kMaxTableBytes || strtab.sh_size > kMaxTableBytes ||
        !inFile(dynsym->sh_offset, dynsym->sh_size) ||
        !inFile(strtab.sh_offset, strtab.sh_size))
      return path_ + " has a damaged dynamic symbol table";
    symbols_.resize(dynsym->sh_size / sizeof(Sym));
    strings_.resize(strtab.sh_size);
    if (!readAt(fd_, dynsym->sh_offset, symbols_.size() * sizeof(Sym), symbols_.data()) ||
        !readAt(fd_, strtab.sh_offset, strings_.size(), strings_.data()))
      return path_ + " could not be read";
    return "";
  }

  // The defined, exported symbol `name`, or null.
  const Sym* exported(const std::string& name) const {
    for (const Sym& s : symbols_) {
      if (s.st_shndx == SHN_UNDEF || s.st_name >= strings_.size()) continue;
      const char* n = strings_.data() + s.st_name;
      const size_t room = strings_.size() - s.st_name;
      if (strnlen(n, room) != name.size() ||
          name.compare(0, name.size(), n, name.size()) != 0)
        continue;
      const int bind = ELF64_ST_BIND(s.st_info);
      const int vis = ELF64_ST_VISIBILITY(s.st_other);
      if ((bind == STB_GLOBAL || bind == STB_WEAK) &&
          (vis == STV_DEFAULT || vis == STV_PROTECTED))
        return &s;
    }
    return nullptr;
  }

  // Reads the initialised data object `s` of exactly `len` bytes; "" when done.
  std::string readObject(const Sym& s, const std::string& name, size_t len,
                         void* out) const {
    if (ELF64_ST_TYPE(s.st_info) != STT_OBJECT || s.st_size != len ||
        s.st_shndx >= sections_.size())
      return path_ + ": " + name + " is not a " + std::to_string(len) +
             "-byte data object";
    const Shdr& sec = sections_[s.st_shndx];
    if (sec.sh_size < len || s.st_value < sec.sh_addr ||
        s.st_value - sec.sh_addr > sec.sh_size - len)
      return path_ + ": " + name + " lies outside its section";
    if (sec.sh_type == SHT_NOBITS) {  // zero-initialised
      std::memset(out, 0, len);
      return "";
    }
    const uint64_t at = sec.sh_offset + (s.st_value - sec.sh_addr);
    if (sec.sh_type != SHT_PROGBITS || at < sec.sh_offset || !inFile(at, len) ||
        !readAt(fd_, at, len, out))
      return path_ + ": " + name + " could not be read";
    return "";
  }

 private:
  bool inFile(uint64_t offset, uint64_t len) const {
    return offset <= size_ && len <= size_ - offset;
  }

  int fd_;
  uint64_t size_;
  std::string path_;
  Ehdr eh_{};
  std::vector<Shdr> sections_;
  std::vector<Sym> symbols_;
  std::string strings_;
};

const char* symbolKind(int type) {
  switch (type) {
    case STT_OBJECT:
      return "a data object";
    case STT_NOTYPE:
      return "a symbol without a type";
    case STT_TLS:
      return "a thread-local variable";
    case STT_GNU_IFUNC:
      return "an indirect function (its resolver would run at load)";
    case STT_SECTION:
      return "a section";
    default:
      return "not a function";
  }
}

Inspection inspectFd(int fd, uint64_t size, const std::string& path,
                     const std::string& entry) {
  Inspection r;
  ElfFile elf(fd, size, path);
  if (r.error = elf.readHeader(); !r.error.empty()) return r;
  if (r.error = elf.readDynamicSymbols(); !r.error.empty()) return r;
  const Sym* e = elf.exported(entry);
  if (!e) {
    r.error = path + " does not export the entry point " + entry +
              " (not a plugin of this kind)";
    return r;
  }
  if (ELF64_ST_TYPE(e->st_info) != STT_FUNC) {
    r.error = path + " exports " + entry + " as " +
              symbolKind(ELF64_ST_TYPE(e->st_info)) +
              ", not as a function: not a ddprun plugin; reinstall ddprun";
    return r;
  }
  const std::string marker = buildIdSymbol(entry);
  const Sym* a = elf.exported(marker);
  if (!a) {
    r.error = path + " has no build id marker " + marker +
              " (a plugin of an older ddprun build?); reinstall ddprun";
    return r;
  }
  char id[kBuildIdSize];
  if (r.error = elf.readObject(*a, marker, sizeof id, id); !r.error.empty()) return r;
  if (id[kBuildIdSize - 1] != '\0' ||
      !std::all_of(id, id + kBuildIdSize - 1,
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
    r.error = path + ": " + marker + " is not a build id (32 hex digits); reinstall ddprun";
    return r;
  }
  r.buildId.assign(id, kBuildIdSize - 1);
  r.ok = true;
  return r;
}

}  // namespace

Inspection inspect(const std::string& path, const std::string& entry) {
  Inspection r;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
    r.error = path + ": " + std::strerror(errno);
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.error = path + " is " + fileTypeName(st.st_mode) + ", not a plugin file";
    return r;
  }
  return inspectFd(fd.get(), static_cast<uint64_t>(st.st_size), path, entry);
}

// ---------------------------------------------------------------- open

namespace {

// "" when `symbol` (from dlsym) is a function of the object loaded as `h`.
std::string checkLoadedEntry(void* h, void* symbol, const std::string& path,
                             const std::string& entry) {
  Dl_info info{};
  void* extra = nullptr;  // the symbol table entry (RTLD_DL_SYMENT)
  if (::dladdr1(symbol, &info, &extra, RTLD_DL_SYMENT) == 0 || !extra)
    return path + ": " + entry + " resolves outside any loaded object";
  const auto* sym = static_cast<const ElfW(Sym)*>(extra);
  if (ELF64_ST_TYPE(sym->st_info) != STT_FUNC)
    return path + " exports " + entry + " as " + symbolKind(ELF64_ST_TYPE(sym->st_info)) +
           ", not as a function";
  link_map* lm = nullptr;
  if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name || !info.dli_fname ||
      std::strcmp(info.dli_fname, lm->l_name) != 0)
    return path + ": " + entry + " resolves to " +
           (info.dli_fname ? info.dli_fname : "?") + ", not to the plugin";
  return "";
}

// "" when the object loaded as `h` is the file `st` describes.
std::string checkSameFile(void* h, const struct stat& st, const std::string& path) {
  link_map* lm = nullptr;
  struct stat now {};
  if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name ||
      ::stat(lm->l_name, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino)
    return path + " was replaced while it was being loaded: not used";
  return "";
}

}  // namespace

Opened openFrom(const std::vector<std::string>& dirs, const std::string& file,
                const std::string& entry, const std::string& wantedId) {
  Opened r;
  Found f = find(dirs, file);
  r.warnings = std::move(f.warnings);
  r.path = f.path;
  if (r.path.empty()) {
    r.error = f.error;
    return r;
  }
  // Held open from the inspection to the comparison after dlopen.
  UniqueFd fd(::open(r.path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    r.error = r.path + ": cannot be read: " + std::strerror(errno);
    return r;
  }
  const Inspection ins =
      inspectFd(fd.get(), static_cast<uint64_t>(st.st_size), r.path, entry);
  if (!ins.ok || ins.buildId != wantedId) {
    r.error = ins.ok ? buildIdMismatch(r.path, ins.buildId, wantedId) : ins.error;
    return r;
  }
  void* h = ::dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    r.error = e ? e : "dlopen failed";
    return r;
  }
  if (r.error = checkSameFile(h, st, r.path); !r.error.empty()) return r;
  void* symbol = ::dlsym(h, entry.c_str());
  if (!symbol) {
    r.error = r.path + " has no entry point " + entry;
    return r;
  }
  if (r.error = checkLoadedEntry(h, symbol, r.path, entry); !r.error.empty()) return r;
  r.symbol = symbol;
  return r;
}

Opened open(const std::string& file, const std::string& entry) {
  Opened r = openFrom(defaultSearchDirs(), file, entry, buildId());
  // Both CUDA plugins are looked for in the same directories: say each once.
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(m);
  for (const auto& w : r.warnings)
    if (said.insert(w).second) DDPRUN_WARN(w);
  return r;
}

}  // namespace ddprun::plugin
