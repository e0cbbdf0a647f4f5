#!/usr/bin/env python3
"""CDK entry: reads the platform config from context, builds the stacks, adds the cdk-nag rule packs."""

from __future__ import annotations

import sys

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks, NIST80053R5Checks

from platform_constructs.config import ConfigError, load_config
from platform_constructs.images import ImageTable
from stacks.launcher_stack import LauncherStack
from stacks.platform_stack import PlatformStack


def build_app(app: cdk.App) -> cdk.App:
    """Add the platform's stacks and checks to app, configured from its context (raises ConfigError)."""
    config = load_config(app.node.get_all_context())
    images = ImageTable.resolve(config.pytorch_versions, config.smp_versions)
    env = cdk.Environment(region=config.region) if config.region else None
    platform = PlatformStack(app, f"{config.name_prefix}-platform", config=config, images=images, env=env)
    LauncherStack(app, f"{config.name_prefix}-launcher", resources=platform.resources, env=env)
    for key, value in config.tags.items():
        cdk.Tags.of(app).add(key, value)
    # Findings of either pack fail the synth; each acknowledgement names its resource and reason.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(verbose=True), NIST80053R5Checks(verbose=True))
    return app


def main() -> None:
    try:
        app = build_app(cdk.App())
    except (ConfigError, ValueError) as err:
        # A bad value is the user's to fix: one message, no traceback.
        print(f"\n{err}\n", file=sys.stderr)
        sys.exit(1)
    app.synth()


if __name__ == "__main__":
    main()
