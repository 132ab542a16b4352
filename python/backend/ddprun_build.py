"""ddprun's PEP 517 build backend: scikit-build-core's, plus the variant.

pyproject.toml names this module (build-system.backend-path) so that the wheel's
metadata can follow the variant without scikit-build-core's deprecated
tool.scikit-build.metadata table: the standard [[tool.dynamic-metadata]]
providers see no config settings, and the CUDA variant is chosen by one,
`-C ddprun.cuda=true` (or DDPRUN_WHEEL_CUDA=1 in the environment, which wins,
as scikit-build-core's own declaration of that setting says). Each hook below
resolves the variant the same way, puts it into DDPRUN_WHEEL_VARIANT ("cpu" or
"cu13") for this process and its children, and hands over to
scikit_build_core.build unchanged. VariantMetadata, the [[tool.dynamic-metadata]]
provider, reads it: version <x.y.z>+cu13 and NVIDIA's packages as dependencies
for the CUDA variant, <x.y.z> and none for the CPU one. The CMake build
(cmake/wheel.cmake) reads it too and refuses to build a variant other than the
one the metadata names. Everything else (the CMake options each variant turns
on, through tool.scikit-build.overrides) is scikit-build-core's, configured in
pyproject.toml.
"""
import os

from scikit_build_core import build as _backend

CONFIG_SETTING = "ddprun.cuda"
ENV_CUDA = "DDPRUN_WHEEL_CUDA"
ENV_VARIANT = "DDPRUN_WHEEL_VARIANT"
CUDA_VARIANT = "cu13"


def _truthy(value):
    """scikit-build-core's reading of a bool config setting or variable."""
    if isinstance(value, bool):
        return value
    value = value.strip().lower()
    if not value:
        return False
    if value.isdigit():
        return bool(int(value))
    return value not in {"n", "no", "off", "false", "f"}


def variant(config_settings=None):
    """"cu13" when the CUDA variant is asked for, else "cpu"."""
    raw = os.environ.get(ENV_CUDA)
    if raw is None:
        raw = (config_settings or {}).get(CONFIG_SETTING, False)
        if isinstance(raw, list):  # given more than once: scikit-build-core refuses it
            raw = raw[-1] if raw else False
    return CUDA_VARIANT if _truthy(raw) else "cpu"


def _announce(config_settings):
    os.environ[ENV_VARIANT] = variant(config_settings)


class VariantMetadata:
    """[[tool.dynamic-metadata]] provider: the fields that depend on the
    variant. Runs after the regex provider has set the version from
    CMakeLists.txt; settings: cuda-dependencies (a list of requirements)."""

    def dynamic_metadata(self, settings, project):
        chosen = os.environ.get(ENV_VARIANT) or variant()
        if chosen == "cpu":
            return {"dependencies": []}
        return {"version": "%s+%s" % (project["version"], chosen),
                "dependencies": list(settings.get("cuda-dependencies", []))}


def get_requires_for_build_wheel(config_settings=None):
    _announce(config_settings)
    return _backend.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _announce(config_settings)
    return _backend.get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    _announce(config_settings)
    return _backend.get_requires_for_build_sdist(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _announce(config_settings)
    return _backend.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _announce(config_settings)
    return _backend.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _announce(config_settings)
    return _backend.build_sdist(sdist_directory, config_settings)


# scikit-build-core offers these only when it can compute the metadata without
# building; a frontend then builds the wheel to get it.
if hasattr(_backend, "prepare_metadata_for_build_wheel"):
    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        _announce(config_settings)
        return _backend.prepare_metadata_for_build_wheel(metadata_directory, config_settings)

if hasattr(_backend, "prepare_metadata_for_build_editable"):
    def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
        _announce(config_settings)
        return _backend.prepare_metadata_for_build_editable(metadata_directory,
                                                            config_settings)
