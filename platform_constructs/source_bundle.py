"""The training package as a SageMaker source directory (sourcedir.tar.gz), published as a CDK asset."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from bundles.sourcedir import build_sourcedir


@dataclass(frozen=True, kw_only=True)
class TrainingSourceBundleProps:
    readers: Sequence[iam.IGrantable] = ()
    """Who may read the bundle (grant_read each): the execution roles of the jobs that run it. @default none"""


class TrainingSourceBundle(Construct):
    """Packs training/ deterministically: the same sources give the same bytes, so the asset hash (and the
    deployment) changes only when the code does."""

    def __init__(self, scope: Construct, id: str, props: TrainingSourceBundleProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or TrainingSourceBundleProps()
        out = Path(tempfile.mkdtemp(prefix="sourcedir-"))
        self.asset = s3_assets.Asset(self, "Asset", path=str(build_sourcedir(out)))
        for reader in props.readers:
            self.grant_read(reader)

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read this one object: its key (a content hash) is known at synth. The CDK's Asset.grant_read would
        open every object of the account's CDK assets bucket, every CDK app's assets. Listing is allowed for
        the key alone, as SageMaker lists an S3Prefix channel (the code channel of an isolated job)."""
        key = self.asset.s3_object_key
        return (iam.Grant.add_to_principal(grantee=grantee, actions=["s3:GetObject"], resource_arns=[self.object_arn])
                .combine(iam.Grant.add_to_principal(
                    grantee=grantee, actions=["s3:ListBucket"], resource_arns=[self.asset.bucket.bucket_arn],
                    conditions={"StringEquals": {"s3:prefix": key}})))

    @property
    def object_arn(self) -> str:
        return self.asset.bucket.arn_for_objects(self.asset.s3_object_key)

    @property
    def s3_uri(self) -> str:
        return self.asset.s3_object_url
