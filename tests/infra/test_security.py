"""Security properties of the synthesized platform (the CDK CLI's templates, default configuration)."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match, Template


@pytest.fixture(scope="module")
def platform(templates) -> Template:
    return Template.from_json(templates["mltrain-platform"])


@pytest.fixture(scope="module")
def resources(templates) -> dict:
    return templates["mltrain-platform"]["Resources"]


def logical_ids(resources: dict, type_: str) -> list[str]:
    return [k for k, r in resources.items() if r["Type"] == type_]


def training_sg(resources: dict) -> str:
    [sg] = [k for k in logical_ids(resources, "AWS::EC2::SecurityGroup") if "TrainingSecurityGroup" in k]
    return sg


def test_efa_security_group_allows_all_traffic_in_and_out_to_itself(platform, resources):
    sg = {"Fn::GetAtt": [training_sg(resources), "GroupId"]}
    platform.has_resource_properties("AWS::EC2::SecurityGroupIngress",
                                     {"GroupId": sg, "SourceSecurityGroupId": sg, "IpProtocol": "-1"})
    platform.has_resource_properties("AWS::EC2::SecurityGroupEgress",
                                     {"GroupId": sg, "DestinationSecurityGroupId": sg, "IpProtocol": "-1"})


def test_training_group_has_no_other_all_traffic_rule(resources):
    sg = training_sg(resources)
    props = resources[sg]["Properties"]
    inline = props.get("SecurityGroupIngress", []) + props.get("SecurityGroupEgress", [])
    assert all(rule["IpProtocol"] != "-1" for rule in inline), inline
    for rule_type, peer in (("AWS::EC2::SecurityGroupIngress", "SourceSecurityGroupId"),
                            ("AWS::EC2::SecurityGroupEgress", "DestinationSecurityGroupId")):
        for key in logical_ids(resources, rule_type):
            rule = resources[key]["Properties"]
            if rule["GroupId"] == {"Fn::GetAtt": [sg, "GroupId"]} and rule["IpProtocol"] == "-1":
                assert rule.get(peer) == {"Fn::GetAtt": [sg, "GroupId"]}, key


def test_fsx_is_open_on_lustre_ports_to_the_training_group_only(resources):
    [fs] = logical_ids(resources, "AWS::FSx::FileSystem")
    [fs_sg] = resources[fs]["Properties"]["SecurityGroupIds"]
    training = {"Fn::GetAtt": [training_sg(resources), "GroupId"]}
    from_outside = sorted(
        (r["Properties"]["FromPort"], r["Properties"]["ToPort"])
        for k in logical_ids(resources, "AWS::EC2::SecurityGroupIngress")
        if (r := resources[k])["Properties"]["GroupId"] == fs_sg
        and r["Properties"].get("SourceSecurityGroupId") != fs_sg)
    assert from_outside == [(988, 988), (1018, 1023)]
    for k in logical_ids(resources, "AWS::EC2::SecurityGroupIngress"):
        rule = resources[k]["Properties"]
        if rule["GroupId"] == fs_sg:
            assert rule.get("SourceSecurityGroupId") in (fs_sg, training), k
            assert "CidrIp" not in rule, k


def test_fsx_is_persistent_2_lz4_encrypted_in_the_first_training_subnet(platform, resources):
    [fs] = logical_ids(resources, "AWS::FSx::FileSystem")
    props = resources[fs]["Properties"]
    assert props["LustreConfiguration"] == {"DataCompressionType": "LZ4", "DeploymentType": "PERSISTENT_2",
                                            "PerUnitStorageThroughput": 250}
    assert props["StorageCapacity"] == 1200
    assert "KmsKeyId" in props
    [subnet] = props["SubnetIds"]
    first_training = sorted(k for k in logical_ids(resources, "AWS::EC2::Subnet") if "training" in k)[0]
    assert subnet == {"Ref": first_training}
    platform.has_resource_properties("AWS::FSx::DataRepositoryAssociation", {
        "FileSystemPath": "/datasets",
        "BatchImportMetaDataOnCreate": True,
        "DataRepositoryPath": {"Fn::Join": ["", ["s3://", Match.any_value(), "/datasets/"]]},
        "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
               "AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}})


def test_training_subnets_are_private_in_two_azs_and_sized_for_efa(resources):
    training = [resources[k]["Properties"] for k in logical_ids(resources, "AWS::EC2::Subnet") if "training" in k]
    assert len(training) == 2
    assert {str(s["AvailabilityZone"]) for s in training} != {str(training[0]["AvailabilityZone"])}
    assert all(s["MapPublicIpOnLaunch"] is False for s in training)
    # 16 instances x 32 EFA addresses + 5 reserved needs at least a /22.
    assert all(int(s["CidrBlock"].split("/")[1]) <= 22 for s in training)


def test_flow_logs_capture_all_traffic_into_an_encrypted_group_with_retention(platform):
    platform.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL", "ResourceType": "VPC"})
    platform.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 90, "KmsKeyId": Match.any_value()})


def test_key_rotates(platform):
    platform.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_every_bucket_is_encrypted_versioned_private_and_expires_old_versions(templates):
    for stack, template in templates.items():
        for key, r in template["Resources"].items():
            if r["Type"] != "AWS::S3::Bucket":
                continue
            p = r["Properties"]
            [rule] = p["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            algorithm = rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"]
            # Only the access-log bucket may use SSE-S3: log delivery cannot write SSE-KMS objects.
            assert algorithm == "aws:kms" or ("AccessLogs" in key and algorithm == "AES256"), (stack, key)
            assert p["VersioningConfiguration"] == {"Status": "Enabled"}, key
            assert p["PublicAccessBlockConfiguration"] == {
                "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True}, key
            [lifecycle] = p["LifecycleConfiguration"]["Rules"]
            assert lifecycle["NoncurrentVersionExpiration"]["NoncurrentDays"] > 0, key
            assert lifecycle["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] > 0, key
            if "AccessLogs" not in key:
                assert "DestinationBucketName" in p["LoggingConfiguration"], key


def test_every_bucket_denies_requests_without_tls(templates):
    checked = 0
    for template in templates.values():
        resources = template["Resources"]
        buckets = set(logical_ids(resources, "AWS::S3::Bucket"))
        tls_only = set()
        for key in logical_ids(resources, "AWS::S3::BucketPolicy"):
            props = resources[key]["Properties"]
            for statement in props["PolicyDocument"]["Statement"]:
                if statement["Effect"] == "Deny" and statement.get("Condition") == {
                        "Bool": {"aws:SecureTransport": "false"}}:
                    tls_only.add(props["Bucket"]["Ref"])
        assert buckets == tls_only
        checked += len(buckets)
    assert checked >= 4


def test_every_log_group_and_topic_is_encrypted(templates):
    for stack, template in templates.items():
        for key, r in template["Resources"].items():
            if r["Type"] == "AWS::Logs::LogGroup":
                assert "KmsKeyId" in r["Properties"], (stack, key)
            if r["Type"] == "AWS::SNS::Topic":
                assert "KmsMasterKeyId" in r["Properties"], (stack, key)


def _policy_statements(templates):
    for stack, template in templates.items():
        for key, r in template["Resources"].items():
            docs = []
            if r["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
                docs.append(r["Properties"]["PolicyDocument"])
            if r["Type"] == "AWS::IAM::Role":
                docs += [p["PolicyDocument"] for p in r["Properties"].get("Policies", [])]
            for doc in docs:
                for statement in doc["Statement"]:
                    yield stack, key, statement


def _as_list(value):
    return value if isinstance(value, list) else [value]


# Actions with no resource-level permissions (IAM service authorization reference), the only ones that may
# take "Resource": "*".
UNSCOPABLE = ("ecr:GetAuthorizationToken", "cloudwatch:PutMetricData", "ec2:Describe", "xray:PutTrace",
              "xray:PutTelemetry", "xray:GetSampling", "logs:CreateLogDelivery", "logs:GetLogDelivery",
              "logs:UpdateLogDelivery", "logs:DeleteLogDelivery", "logs:ListLogDeliveries",
              "logs:PutResourcePolicy", "logs:DescribeResourcePolicies", "logs:DescribeLogGroups",
              "sagemaker:ListTrainingJobs", "pricing:GetProducts")


def test_no_wildcard_actions_anywhere(templates):
    statements = list(_policy_statements(templates))
    assert statements
    for stack, key, statement in statements:
        for action in _as_list(statement.get("Action", [])):
            assert action != "*" and not action.endswith(":*"), (stack, key, action)


def test_resource_star_only_for_actions_that_cannot_be_scoped(templates):
    for stack, key, statement in _policy_statements(templates):
        if "*" in _as_list(statement.get("Resource", [])):
            for action in _as_list(statement["Action"]):
                assert action.startswith(UNSCOPABLE), (stack, key, action)


def test_execution_role_is_for_sagemaker_in_this_account_only(platform, resources):
    platform.has_resource_properties("AWS::IAM::Role", {"AssumeRolePolicyDocument": {"Statement": [{
        "Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
        "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
                      "ArnLike": {"aws:SourceArn": Match.any_value()}}}]}})
    # ... and for this platform's own jobs (the confused-deputy condition): training-job/mltrain-*.
    [role] = [r for k, r in resources.items() if r["Type"] == "AWS::IAM::Role" and k.startswith("ExecutionRole")]
    [statement] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    source = statement["Condition"]["ArnLike"]["aws:SourceArn"]["Fn::Join"][1]
    assert source[-1] == ":training-job/mltrain-*", source
    assert role["Properties"]["Path"] == "/mltrain/"  # the key's users (platform_constructs.encryption)


def test_key_policy_gives_the_account_administration_not_use(resources):
    [key] = [r for r in resources.values() if r["Type"] == "AWS::KMS::Key"]
    statements = {s["Sid"]: s for s in key["Properties"]["KeyPolicy"]["Statement"]}
    admin = statements["KeyAdministration"]
    assert "kms:PutKeyPolicy" not in admin["Action"] and "kms:Put*" in admin["Action"]  # stays manageable
    assert not {"kms:*", "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*", "kms:CreateGrant",
                "kms:Create*"} & set(admin["Action"])
    for statement in statements.values():
        assert statement["Action"] != "kms:*", statement
        if "kms:Decrypt" in statement["Action"] and "AWS" in statement["Principal"]:
            assert "Condition" in statement, statement  # account principals only under a condition


def test_settings_are_published_as_outputs_and_ssm_parameters(platform, templates):
    outputs = templates["mltrain-platform"]["Outputs"]
    for name in ("SubnetIds", "TrainingSecurityGroupId", "FsxFileSystemId", "FsxMountName", "CheckpointBucket",
                 "OutputBucket", "DatasetBucket", "KmsKeyArn", "ExecutionRoleArn", "PlatformSettings",
                 "TrainingPlans", "TrainingSourceUri"):
        assert name in outputs, name
    for name in ("platform-settings", "subnet-ids", "training-security-group-id", "fsx-file-system-id",
                 "execution-role-arn", "checkpoint-bucket"):
        platform.has_resource_properties("AWS::SSM::Parameter", {"Name": f"/mltrain/{name}"})
