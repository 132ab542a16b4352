// The `train` program (trainer.h's trainMain): flags, the files they name,
// data, the process group, then runTraining; exceptions become exit codes.
#include <cstdio>
#include <cstdint>
#include <filesystem>

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/progress_file.h"
#include "ddprun/runtime/process_group.h"
#include "ddprun/store/hash_store.h"
#include "ddprun/train/backend_choice.h"
#include "ddprun/train/cifar.h"
#include "ddprun/train/data_choice.h"
#include "ddprun/train/files.h"
#include "ddprun/train/trainer.h"
#include "ddprun/train/transforms.h"

namespace ddprun::train {
namespace {

using runtime::ProcessGroup;

bool envRestarted() {
  return env::integer("TORCHELASTIC_RESTART_COUNT", 0, 0, INT32_MAX) > 0;
}

// The files named on the command line, checked before any work: --init is
// read by every rank; --save and --metrics are written by rank 0 only.
// Returns "" or the error.
std::string pathsProblem(const TrainConfig& cfg, bool rank0) {
  if (!cfg.init.empty())
    if (auto e = regularFileProblem(cfg.init); !e.empty())
      return "--init " + cfg.init + ": " + e;
  if (!rank0) return "";
  if (!cfg.save.empty()) {
    if (auto e = replaceTargetProblem(cfg.save); !e.empty())
      return "--save " + cfg.save + " " + e;
    const std::filesystem::path dir = std::filesystem::path(cfg.save).parent_path();
    std::error_code ec;
    if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
      return "--save " + cfg.save + " is in a directory that does not exist (" +
             dir.string() + ")";
  }
  if (!cfg.metrics.empty())
    if (auto e = appendTargetProblem(cfg.metrics); !e.empty())
      return "--metrics " + cfg.metrics + " " + e;
  return "";
}

// Under ddprun or torchrun: the launcher's environment; alone: one rank over
// an in-process store.
std::unique_ptr<ProcessGroup> joinGroup() {
  if (env::get("RANK") && env::get("WORLD_SIZE")) return ProcessGroup::fromEnv();
  return ProcessGroup::create(std::make_shared<store::HashStore>(), 0, 1, runtime::optionsFromEnv());
}

}  // namespace

int trainMain(int argc, const char* const* argv) {
  const ParseResult pr = parseTrainArgs(argc, argv);
  if (!pr.config) {
    // The help once (rank 0); an error on every rank: whichever rank exits
    // first ends the group, so a message left to rank 0 could be lost.
    if (pr.exitCode == 0) {
      if (printsParseOutput(env::get("RANK"), env::get("LOCAL_RANK")))
        std::fputs(pr.output.c_str(), stdout);
    } else {
      std::fprintf(stderr, "train: error: %s\n", pr.output.c_str());
    }
    return pr.exitCode;
  }
  const TrainConfig& cfg = *pr.config;
  const bool rank0 = env::integer("RANK", 0, 0, INT32_MAX) == 0;
  if (const std::string e = pathsProblem(cfg, rank0); !e.empty()) {
    std::fprintf(stderr, "train: error: %s\n", e.c_str());
    return 2;
  }
  try {
    decideDevice(cfg.device, cfg.precision, probeDevices(cfg.device));  // before any work
    DataSplit data = loadTrainData(cfg, *parseDataFormat(cfg.dataFormat));
    if (const std::string e = modelDataProblem(cfg, data.train); !e.empty())
      DDPRUN_THROW(InvalidArgument, e);
    if (!cfg.normalize.empty()) {
      NormalizeSpec n;
      try {
        n = parseNormalize(cfg.normalize, data.train.channels);
      } catch (const InvalidArgument& e) {
        DDPRUN_THROW(InvalidArgument, "--normalize for --data ", cfg.data, " (",
                     data.train.channels, " channels): ", e.message());
      }
      for (Dataset* d : {&data.train, &data.test}) {
        d->mean = n.mean;
        d->std = n.std;
      }
    }
    auto pg = joinGroup();
    TrainerIo io;
    io.restarted = envRestarted();
    io.runId = env::get("TORCHELASTIC_RUN_ID").value_or("");
    io.progressFile = env::get(kProgressFileEnv).value_or("");
    const nlohmann::json summary = runTraining(cfg, data, *pg, io);
    if (pg->rank() == 0) {
      std::fprintf(stdout, "%s\n", summary.dump().c_str());
      std::fflush(stdout);
    }
    return 0;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "train: error: %s\n", e.message().c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "train: failed: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: failed: %s\n", e.what());
    return 1;
  }
}

}  // namespace ddprun::train
