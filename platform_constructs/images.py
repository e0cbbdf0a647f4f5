"""Container images for training jobs, resolved at synth time by the SageMaker SDK's offline resolver.

The table of image accounts per region is the SDK's (sagemaker-core), not ours: we ask it for every
region the image exists in and keep the answers in a CloudFormation mapping, so one environment-
agnostic template picks the right URI in whatever region it is deployed. The launcher Lambda gets
the resolved table through the platform settings and never bundles the SDK.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from constructs import Construct
from sagemaker.core import image_uris

from jobs.render.images import PYTORCH_FRAMEWORK, SMP_FRAMEWORK

# A GPU and a CPU instance type only steer the resolver to the -gpu- or -cpu- image tag.
_PROBE_INSTANCE = {"gpu": "ml.p5.48xlarge", "cpu": "ml.c5.2xlarge"}
FRAMEWORKS = {PYTORCH_FRAMEWORK: ("gpu", "cpu"), SMP_FRAMEWORK: ("gpu",)}


def _versions_config(framework: str, version: str) -> dict:
    config = image_uris.config_for_framework(framework)
    versions = config.get("training", config)["versions"]
    if version not in versions:
        known = ", ".join(list(versions)[-8:])
        raise ValueError(f"{framework} version {version} has no SageMaker training image; recent ones: {known}")
    return versions[version]


def _key(framework: str, version: str, kind: str) -> str:
    # CloudFormation mapping keys must be alphanumeric.
    return f"{framework.replace('-', '')}{version.replace('.', '')}{kind}"


@dataclass(frozen=True)
class ImageTable:
    """Per region: {mapping key: image URI}, plus the registry account of each framework."""

    by_region: dict[str, dict[str, str]]
    versions: dict[str, tuple[str, ...]]

    @classmethod
    def resolve(cls, pytorch_versions: tuple[str, ...], smp_versions: tuple[str, ...]) -> ImageTable:
        versions = {PYTORCH_FRAMEWORK: pytorch_versions, SMP_FRAMEWORK: smp_versions}
        by_region: dict[str, dict[str, str]] = {}
        regions: set[str] | None = None
        for framework, kinds in FRAMEWORKS.items():
            for version in versions[framework]:
                cfg = _versions_config(framework, version)
                here = set(cfg["registries"])
                regions = here if regions is None else regions & here
                for region in here:
                    row = by_region.setdefault(region, {})
                    row[f"{framework.replace('-', '')}account"] = cfg["registries"][region]
                    for kind in kinds:
                        row[_key(framework, version, kind)] = image_uris.retrieve(
                            framework, region=region, version=version, py_version=cfg["py_versions"][-1],
                            instance_type=_PROBE_INSTANCE[kind], image_scope="training")
        # Keep only the regions where every configured image exists, so a lookup never misses.
        return cls(by_region={r: by_region[r] for r in sorted(regions or ())}, versions=versions)

    def to_mapping(self, scope: Construct, id: str) -> ImageMapping:
        return ImageMapping(scope, id, ImageMappingProps(table=self))


@dataclass(frozen=True, kw_only=True)
class ImageMappingProps:
    table: ImageTable
    """The resolved image table (ImageTable.resolve): per region, each image's URI and each framework's account."""


class ImageMapping(Construct):
    """The image table as a CfnMapping, with lookups that resolve in the deployed region."""

    def __init__(self, scope: Construct, id: str, props: ImageMappingProps) -> None:
        super().__init__(scope, id)
        self.table = props.table
        self.mapping = cdk.CfnMapping(self, "ByRegion", mapping=props.table.by_region, lazy=True)

    def uri(self, framework: str, version: str, kind: str) -> str:
        return self.mapping.find_in_map(cdk.Aws.REGION, _key(framework, version, kind))

    def account(self, framework: str) -> str:
        return self.mapping.find_in_map(cdk.Aws.REGION, f"{framework.replace('-', '')}account")

    def settings(self) -> dict[str, dict[str, dict[str, str]]]:
        """The `images` entry of the platform settings (jobs.platform.PlatformSettings)."""
        return {
            framework: {v: {kind: self.uri(framework, v, kind) for kind in kinds}
                        for v in self.table.versions[framework]}
            for framework, kinds in FRAMEWORKS.items()
        }
