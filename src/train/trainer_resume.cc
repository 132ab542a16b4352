// Where a run starts and what it leaves for a restart: checkpoints (run.h).
#include "run.h"

#include <filesystem>

namespace ddprun::train::run_detail {

// Every field is checked before anything of the file is used; the model,
// optimizer and position change only when the whole file fits.
bool Run::applyCheckpoint(const CheckpointFile& file, std::string* why) {
  SafeTensors st;
  try {
    st = loadSafetensors(file.path);
  } catch (const CheckpointError& e) {
    *why = e.message();
    return false;
  }
  CheckpointPosition p;
  *why = readCheckpointMetadata(file.path, st.metadata, shape(), file.tag, &p);
  if (!why->empty() || !copyInto(st, file.path, *model_, optim_.get(), *be_, why)) return false;
  pos_ = {.epoch = p.epoch, .step = p.step, .globalStep = p.globalStep};
  optim_->setSteps(p.optimizerSteps);
  rng_.restore(p.rng);
  resumed_ = p.totals;
  if (!p.sameLayout && pos_.step != 0) {
    notice("checkpoint " + file.path + " was taken with another world size, batch size or "
           "seed: resuming at the start of epoch " + std::to_string(pos_.epoch));
    pos_.step = 0;
  }
  return true;
}

// Rank 0's choice of where to start, made before any rank trains.
struct Run::StartPlan {
  enum Kind : int64_t { kFresh = 0, kResume = 1, kNoUsable = 2, kRefuse = 3 };
  int64_t kind = kFresh;
  std::string path, tag;  // kResume: the checkpoint; kNoUsable, kRefuse: the reason
};

// The checkpoints a start may resume from: this run's own (a launcher
// restart, or a relaunch with the same run id and --resume); with --resume and
// none of its own, those of the run written last.
std::vector<CheckpointFile> Run::resumeCandidates() {
  std::vector<CheckpointFile> mine = listCheckpoints(cfg_.checkpointDir, tag_);
  if (!mine.empty() || !cfg_.resume) return mine;
  const std::optional<std::string> last = lastWrittenRun(cfg_.checkpointDir);
  if (!last) return {};
  notice("--resume: continuing the run whose checkpoint was written last (" +
         (last->empty() ? std::string("files without a run id") : "run '" + *last + "'") +
         "); this run's own checkpoints are named after its id '" + runId_ + "'");
  return listCheckpoints(cfg_.checkpointDir, *last);
}

Run::StartPlan Run::planStart() {
  StartPlan plan;
  if (!io_.restarted && !cfg_.resume) {
    if (!listCheckpoints(cfg_.checkpointDir, tag_).empty()) {
      plan.kind = StartPlan::kRefuse;
      plan.path = cfg_.checkpointDir +
                  " holds checkpoints of an earlier launch with this run id ('" + runId_ +
                  "'): pass --resume to continue them, or give this job another run id "
                  "(--rdzv-id) or another --checkpoint-dir";
    } else if (!listCheckpoints(cfg_.checkpointDir).empty()) {
      notice(cfg_.checkpointDir + " holds checkpoints of other runs: they are kept, and this "
             "run (id '" + runId_ + "') starts from the beginning; pass --resume to "
             "continue the one written last");
    }
    return plan;
  }
  std::string refused;
  for (const CheckpointFile& f : resumeCandidates()) {
    std::string why;
    if (applyCheckpoint(f, &why)) {
      plan = {StartPlan::kResume, f.path, f.tag};
      return plan;
    }
    notice("refusing checkpoint: " + why);
    refused += (refused.empty() ? "" : "; ") + why;
  }
  if (!refused.empty()) plan = {StartPlan::kNoUsable, refused, ""};
  return plan;
}

// Rank 0 decides (naming every checkpoint it refuses); the others follow and
// load the same file.
void Run::start() {
  StartPlan plan;
  if (rank0_) plan = planStart();
  if (pg_.size() > 1) {
    runtime::broadcast(pg_, {.buffer = &plan.kind, .count = 1, .dtype = DType::kInt64});
    broadcastString(pg_, plan.path);
    broadcastString(pg_, plan.tag);
  }
  const std::string why = rank0_ ? ": " + plan.path : std::string(" (rank 0 says why)");
  if (plan.kind == StartPlan::kRefuse) DDPRUN_THROW(InvalidArgument, "cannot start", why);
  if (plan.kind == StartPlan::kNoUsable)
    DDPRUN_THROW(CheckpointError, "no usable checkpoint in ", cfg_.checkpointDir, why,
                 ". Remove the bad files or point --checkpoint-dir elsewhere");
  if (plan.kind == StartPlan::kFresh) {
    if (io_.restarted || cfg_.resume)
      notice("no checkpoint of this run in " + cfg_.checkpointDir +
             ": starting from the beginning");
    return;
  }
  std::string err;
  if (!rank0_ && !applyCheckpoint({plan.path, plan.tag, 0}, &err))
    DDPRUN_THROW(CheckpointError, "cannot resume: ", err);
  reducer_->zeroGrad();
  notice("resuming from " + plan.path + " (epoch " + std::to_string(pos_.epoch) +
         ", step " + std::to_string(pos_.step) + ", global step " +
         std::to_string(pos_.globalStep) + ")");
  metrics_.write({{"type", "resume"},
                  {"checkpoint", plan.path},
                  {"epoch", pos_.epoch},
                  {"step", pos_.step},
                  {"global_step", pos_.globalStep},
                  {"run", runId_}});
}

void Run::saveCheckpoint(bool epochDone) {
  if (!rank0_ || cfg_.checkpointDir.empty()) return;
  RunTotals totals{.runSeconds = runSeconds(),
                   .runSamples = resumed_.runSamples + samplesSeen_};
  if (!epochDone) {
    totals.epochLossSum = epochLossSum_;
    totals.epochLossCount = epochLossCount_;
    totals.epochSeconds = epochPriorSeconds_ + since(epochStart_);
  }
  std::vector<std::vector<int64_t>> counts;
  HostSnapshot snap(*be_);
  const auto tensors = modelTensors(*model_, optim_.get(), snap, counts);
  CheckpointPosition p{.epoch = pos_.epoch,
                       .step = pos_.step,
                       .globalStep = pos_.globalStep,
                       .optimizerSteps = optim_->steps(),
                       .rng = rng_.state(),
                       .run = runId_,
                       .totals = totals};
  saveSafetensors(cfg_.checkpointDir + "/" + checkpointFileName(tag_, pos_.globalStep),
                  tensors, checkpointMetadata(shape(), p));
  pruneCheckpoints(cfg_.checkpointDir, tag_, cfg_.keepCheckpoints);
}

// Rank 0, at start: the checkpoint directory exists, and the temporaries of
// writers that died mid-save (here or at --save's path) are gone.
void Run::clearStaleTemporaries() {
  std::vector<std::string> removed;
  if (!cfg_.checkpointDir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.checkpointDir, ec);
    if (ec)
      DDPRUN_THROW(InvalidArgument, "cannot create --checkpoint-dir ", cfg_.checkpointDir, ": ",
                   ec.message());
    removed = removeStaleTemporaries(cfg_.checkpointDir, [](const std::string& name) {
      return parseCheckpointName(name).has_value();
    });
  }
  if (!cfg_.save.empty()) {
    const std::filesystem::path save(cfg_.save);
    const std::string dir =
        save.parent_path().empty() ? "." : save.parent_path().string();
    const std::string base = save.filename().string();
    for (std::string& n : removeStaleTemporaries(
             dir, [&](const std::string& name) { return name == base; }))
      removed.push_back(std::move(n));
  }
  if (!removed.empty())
    notice("removed " + std::to_string(removed.size()) +
           " temporary file(s) of interrupted saves: " + str::join(removed, ", "));
}

}  // namespace ddprun::train::run_detail
