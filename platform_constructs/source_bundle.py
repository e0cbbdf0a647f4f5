"""The training package as a SageMaker source directory (sourcedir.tar.gz), published as a CDK asset."""

from __future__ import annotations

import tempfile
from pathlib import Path

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from bundles.sourcedir import build_sourcedir
from platform_constructs.nag import acknowledge, nag_form


class TrainingSourceBundle(Construct):
    """Packs training/ deterministically: the same sources give the same bytes, so the asset hash (and the
    deployment) changes only when the code does."""

    def __init__(self, scope: Construct, id: str, *, readers: list[iam.IGrantable]) -> None:
        super().__init__(scope, id)
        out = Path(tempfile.mkdtemp(prefix="sourcedir-"))
        self.asset = s3_assets.Asset(self, "Asset", path=str(build_sourcedir(out)))
        for reader in readers:
            self.asset.grant_read(reader)
            finding = nag_form(self, self.asset.bucket.arn_for_objects("*"))
            acknowledge(reader, f"AwsSolutions-IAM5[Resource::{finding}]",
                        "The CDK asset grant lets training jobs read the training source bundle "
                        "(sourcedir.tar.gz); asset object keys are content hashes not known before synth.")

    @property
    def s3_uri(self) -> str:
        return self.asset.s3_object_url
