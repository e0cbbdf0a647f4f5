"""The platform configuration: every value a platform team changes, read from CDK context by app.py.

Build-side only (app.py reads it and hands typed props to the stacks); the constructs never see it.
"""

from platform_config.loader import PlatformConfigError, is_platform_key, load_config
from platform_config.model import LOG_RETENTION_DAYS, PlatformConfig
from platform_config.tested_torch import TESTED_TORCH_VERSIONS

__all__ = ["LOG_RETENTION_DAYS", "TESTED_TORCH_VERSIONS", "PlatformConfig", "PlatformConfigError", "is_platform_key",
           "load_config"]
