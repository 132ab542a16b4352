// The one table of `ddprun` flags (torchrun 2.x's, in run.py's order, plus
// --version), and what is generated from it besides the parser: --help and
// the shell completion scripts of --print-completion.
#include <sstream>

#include "ddprun/cli/launch_cli.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::cli {

namespace {
// A flag torchrun declares with both spellings and a PET_ fallback
// (argparse_util.env / check_env).
FlagInfo dual(const std::string& dest, bool takesValue, std::string metavar,
              std::string defaultText, std::string help) {
  FlagInfo f;
  f.dest = dest;
  std::string dashed = str::replaceAll(dest, "_", "-");
  f.names = {"--" + dashed};
  if (dashed != dest) f.names.push_back("--" + dest);
  f.takesValue = takesValue;
  f.metavar = std::move(metavar);
  f.defaultText = std::move(defaultText);
  std::string up = dest;
  for (char& ch : up)
    ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  f.envVar = "PET_" + up;
  f.help = std::move(help);
  return f;
}

FlagInfo value(const std::string& dest, std::string metavar, std::string defaultText,
               std::string help) {
  return dual(dest, true, std::move(metavar), std::move(defaultText), std::move(help));
}

FlagInfo flag(const std::string& dest, std::string help) {
  return dual(dest, false, "", "", std::move(help));
}

FlagInfo withShort(FlagInfo f, const std::string& shortName) {
  f.names.insert(f.names.begin(), shortName);
  return f;
}

FlagInfo noEnv(FlagInfo f) {
  f.envVar.clear();
  return f;
}

// Only the dashed spelling and no PET_ variable (argparse's own flags).
FlagInfo single(FlagInfo f) {
  f.names.resize(1);
  return noEnv(std::move(f));
}

FlagInfo choices(FlagInfo f, std::vector<std::string> values) {
  f.choices = std::move(values);
  return f;
}

std::vector<FlagInfo> makeFlags() {
  return {
      withShort(single(flag("help", "Show this help and exit.")), "-h"),
      value("nnodes", "N|MIN:MAX", "1:1",
            "Number of nodes, or a range MIN:MAX (elastic, with --rdzv-backend=c10d)."),
      value("nproc_per_node", "N|cpu|gpu|auto", "1", "Workers per node."),
      value("rdzv_backend", "static|c10d", "static", "Rendezvous backend."),
      value("rdzv_endpoint", "HOST[:PORT]", "",
            "Where the nodes meet (c10d: port 29400 by default); with static, node 0's "
            "address and port."),
      value("rdzv_id", "ID", "none", "Job id shared by every node."),
      value("rdzv_conf", "KEY=VALUE,...", "",
            "Rendezvous settings, e.g. timeout=900 (static), join_timeout=600 (c10d)."),
      flag("standalone",
           "One node: a free local port and a fresh run id; rendezvous flags are "
           "ignored."),
      value("max_restarts", "N", "0", "Worker group restarts before failing."),
      value("monitor_interval", "SECONDS", "0.1",
            "Accepted; ddprun sees worker exits as they happen."),
      choices(value("start_method", "METHOD", "spawn",
                    "Accepted; no effect on script workers."),
              {"spawn", "fork", "forkserver"}),
      value("event_log_handler", "NAME", "null", "Events handler: null or console."),
      value("role", "NAME", "default", "Worker role: ROLE_NAME and the output prefix."),
      withShort(flag("module", "Run the script as a Python module (python -m)."), "-m"),
      flag("no_python", "Run the script as a program, without python."),
      flag("run_path", "Run the script with runpy.run_path."),
      value("log_dir", "DIR", "",
            "Base directory for worker logs (default: a fresh temporary one)."),
      withShort(value("redirects", "0-3|RANK:0-3,...", "0",
                      "Worker streams sent to files only: 1 stdout, 2 stderr, 3 both."),
                "-r"),
      withShort(value("tee", "0-3|RANK:0-3,...", "0",
                      "Worker streams copied to files and the console."),
                "-t"),
      value("local_ranks_filter", "RANKS", "",
            "Local ranks shown on the console, e.g. 0,1."),
      value("duplicate_stdout_filters", "TEXT,...", "",
            "Copy stdout lines containing one of these to a file (,, is a comma)."),
      value("duplicate_stderr_filters", "TEXT,...", "",
            "Copy stderr lines containing one of these to a file (,, is a comma)."),
      value("node_rank", "R", "0", "This node's rank (static rendezvous)."),
      value("master_addr", "HOST", "127.0.0.1", "Node 0's address (static rendezvous)."),
      value(
          "master_port", "PORT", "",
          "Node 0's store port (static rendezvous; default 29500, or a free port on one "
          "node when not given)."),
      value(
          "local_addr", "HOST", "",
          "The address this node advertises (c10d; never resolved): MASTER_ADDR when it "
          "hosts the worker store."),
      noEnv(value("logs_specs", "NAME", "",
                  "Accepted; Python entry points cannot be loaded.")),
      noEnv(choices(
          value("numa_binding", "MODE", "", "Accepted; workers are not bound yet."),
          {"node", "socket", "exclusive", "core-complex"})),
      value("signals_to_handle", "SIGNALS", "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            "Signals forwarded to the workers."),
      value("shutdown_timeout", "SECONDS", "",
            "Grace between SIGTERM and SIGKILL (default TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "
            "else 30)."),
      flag("virtual_local_rank", "LOCAL_RANK=0 with one visible GPU per worker."),
      value("log_line_prefix_template", "TEMPLATE", "",
            "Prefix of teed lines: ${role_name} ${rank} ${local_rank} ${hostname} "
            "(default TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else "
            "[${role_name}${local_rank}]:)."),
      noEnv(choices(value("print_completion", "SHELL", "",
                          "Print a shell completion script for ddprun and exit."),
                    {"bash", "zsh", "tcsh"})),
      noEnv(
          value("status_port", "PORT", "",
                "Serve /status, /healthz and /metrics over HTTP on this port (0: a free "
                "port, printed; ddprun only). Read it with `ddprun status HOST:PORT`.")),
      noEnv(value("status_addr", "ADDR", "127.0.0.1",
                  "The IP address --status-port listens on (ddprun only).")),
      value("progress_timeout", "SECONDS", "",
            "Fail the worker group when a worker that reported progress "
            "(DDPRUN_PROGRESS_FILE) reports none for this long (default off; ddprun "
            "only)."),
      single(flag("version", "Print ddprun's version and exit (ddprun only).")),
  };
}

constexpr size_t kHelpColumn = 30;
constexpr size_t kHelpWidth = 100;

// `text` in lines of at most kHelpWidth columns, continued at kHelpColumn.
std::string wrapped(const std::string& text) {
  std::string out, line;
  for (const auto& word : str::split(text, ' ')) {
    if (!line.empty() && kHelpColumn + line.size() + 1 + word.size() > kHelpWidth) {
      out += line + "\n" + std::string(kHelpColumn, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

// "--nnodes N|MIN:MAX" or "-m, --module".
std::string synopsis(const FlagInfo& f) {
  std::string s = str::join(f.names, ", ");
  if (f.takesValue) s += " " + f.metavar;
  return s;
}

// A word in a single-quoted shell string.
std::string shellQuoted(const std::string& s) { return str::replaceAll(s, "'", "'\\''"); }

std::vector<std::string> allNames() {
  std::vector<std::string> out;
  for (const auto& f : launchFlags())
    out.insert(out.end(), f.names.begin(), f.names.end());
  return out;
}

// Bash splits `--flag=value` at '=' (COMP_WORDBREAKS): the loop skips
// flags, their values and '=', and once the script is reached every later
// word is a file name.
std::string bashScript() {
  std::vector<std::string> valueNames;
  std::ostringstream cases;
  for (const auto& f : launchFlags()) {
    if (!f.takesValue) continue;
    std::string pattern = str::join(f.names, "|");
    valueNames.push_back(pattern);
    if (!f.choices.empty())
      cases << "    " << pattern << ") COMPREPLY=($(compgen -W '"
            << str::join(f.choices, " ") << "' -- \"$cur\")); return;;\n";
    else if (f.dest == "log_dir")
      cases << "    " << pattern << ") COMPREPLY=($(compgen -d -- \"$cur\")); return;;\n";
  }
  std::ostringstream s;
  s << "# bash completion for ddprun, generated by `ddprun --print-completion bash`.\n"
       "# Install: ddprun --print-completion bash > "
       "~/.local/share/bash-completion/completions/ddprun\n"
       "_ddprun() {\n"
       "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} i\n"
       "  [[ $prev == = ]] && prev=${COMP_WORDS[COMP_CWORD-2]}\n"
       "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
       "    case ${COMP_WORDS[i]} in\n"
       "    "
    << str::join(valueNames, "|")
    << ")\n"
       "      ((i++)); [[ ${COMP_WORDS[i]} == = ]] && ((i++));;\n"
       "    --) COMPREPLY=($(compgen -f -- \"$cur\")); return;;\n"
       "    -*) ;;\n"
       "    *) COMPREPLY=($(compgen -f -- \"$cur\")); return;;\n"
       "    esac\n"
       "  done\n"
       "  case $prev in\n"
    << cases.str() << "    " << str::join(valueNames, "|")
    << ") COMPREPLY=(); return;;\n"
       "  esac\n"
       "  if [[ $cur == -* ]]; then\n"
       "    COMPREPLY=($(compgen -W '"
    << str::join(allNames(), " ")
    << "' -- \"$cur\"))\n"
       "  else\n"
       "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
       "  fi\n"
       "}\n"
       "complete -o filenames -F _ddprun ddprun\n";
  return s.str();
}

// zsh's _arguments: '(exclusions)'{--a=,--b=}'[help]:message:action'.
std::string zshEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '[' || ch == ']' || ch == ':') out += '\\';
    out += ch;
  }
  return shellQuoted(out);
}

std::string zshSpec(const FlagInfo& f) {
  std::string names;
  for (const auto& n : f.names)
    names += (names.empty() ? "" : ",") + n + (f.takesValue ? "=" : "");
  std::string spec = "'(" + str::join(f.names, " ") + ")'";
  spec += f.names.size() > 1 ? "{" + names + "}" : "'" + names + "'";
  spec += "'[" + zshEscape(f.help) + "]";
  if (f.takesValue) {
    std::string action = " ";
    if (!f.choices.empty()) action = "(" + str::join(f.choices, " ") + ")";
    if (f.dest == "log_dir") action = "_directories";
    spec += ":" + zshEscape(f.metavar) + ":" + action;
  }
  return spec + "'";
}

std::string zshScript() {
  std::ostringstream s;
  s << "#compdef ddprun\n"
       "# zsh completion for ddprun, generated by `ddprun --print-completion zsh`.\n"
       "# Install: ddprun --print-completion zsh > ~/.zsh/completions/_ddprun (a "
       "directory in "
       "$fpath)\n"
       "_arguments -S -A '-*' \\\n";
  for (const auto& f : launchFlags()) s << "  " << zshSpec(f) << " \\\n";
  s << "  '1:training script:_files' \\\n"
       "  '*::script arguments:_normal'\n";
  return s.str();
}

std::string tcshScript() {
  std::vector<std::string> longs, shorts;
  std::ostringstream next;
  for (const auto& f : launchFlags()) {
    for (const auto& n : f.names)
      (str::startsWith(n, "--") ? longs : shorts)
          .push_back(n.substr(str::startsWith(n, "--") ? 2 : 1));
    for (const auto& n : f.names) {
      if (!f.choices.empty())
        next << " 'n/" << n << "/(" << str::join(f.choices, " ") << ")/'";
      else if (f.dest == "log_dir")
        next << " 'n/" << n << "/d/'";
    }
  }
  std::ostringstream s;
  s << "# tcsh completion for ddprun, generated by `ddprun --print-completion tcsh`.\n"
       "complete ddprun 'c/--/("
    << str::join(longs, " ") << ")/' 'c/-/(" << str::join(shorts, " ") << ")/'"
    << next.str() << " 'p/*/f/'\n";
  return s.str();
}
}  // namespace

const std::vector<FlagInfo>& launchFlags() {
  static const std::vector<FlagInfo> flags = makeFlags();
  return flags;
}

std::string launchHelp() {
  std::ostringstream s;
  s << "usage: ddprun [flags] SCRIPT [SCRIPT ARGS...]\n\n"
       "A native drop-in for torchrun: starts and watches the workers of a distributed\n"
       "training job on this node. Every word after SCRIPT goes to the script.\n"
       "A flag may also come from its PET_ variable (the command line wins).\n\n"
       "flags:\n";
  for (const auto& f : launchFlags()) {
    std::string left = "  " + synopsis(f);
    std::string right = f.help;
    if (!f.choices.empty()) right += " One of: " + str::join(f.choices, ", ") + ".";
    if (!f.defaultText.empty()) right += " Default: " + f.defaultText + ".";
    if (!f.envVar.empty()) right += " Env: " + f.envVar + ".";
    if (left.size() + 2 > kHelpColumn)
      s << left << "\n" << std::string(kHelpColumn, ' ');
    else
      s << left << std::string(kHelpColumn - left.size(), ' ');
    s << wrapped(right) << "\n";
  }
  s << "\nExit codes: 0 success, 1 workers failed, 2 bad flags, 3 setup failed, 128+S "
       "after signal S;\nwith DDPRUN_EXIT_CODES=torchrun, torchrun's: 0, 2 bad flags, 1 any "
       "other failure.\nSee docs/cli.md for the differences from torchrun.\n";
  return s.str();
}

std::string completionScript(const std::string& shell) {
  if (shell == "bash") return bashScript();
  if (shell == "zsh") return zshScript();
  if (shell == "tcsh") return tcshScript();
  DDPRUN_THROW(InvalidArgument, "--print-completion: invalid choice '",
               str::escape(shell), "' (choose from bash, zsh, tcsh)");
}

}  // namespace ddprun::cli
