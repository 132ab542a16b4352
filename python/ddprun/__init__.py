"""Python companions of the ddprun programs (ddprun, ddprun-store, train are
native executables in the environment's bin/):

  python -m ddprun.plot metrics.jsonl [-o curves.png]    train --metrics curves
                                                          (pip install 'ddprun[plot]')
  python -m ddprun.checkpoint FILE                       a checkpoint's metadata and tensors
  ddprun.checkpoint.load(path)                           (state_dict, optimizer_state, metadata)
                                                          for PyTorch (needs only torch)
  ddprun.progress.report(step, loss=..., total_steps=...)  training progress for the agent
                                                          (`ddprun status`, /metrics,
                                                          --progress-timeout); a no-op
                                                          outside ddprun
"""
try:
    from importlib.metadata import PackageNotFoundError, version as _version

    try:
        __version__ = _version("ddprun")
    except PackageNotFoundError:  # imported from a source tree
        __version__ = "unknown"
except ImportError:  # Python < 3.8
    __version__ = "unknown"
