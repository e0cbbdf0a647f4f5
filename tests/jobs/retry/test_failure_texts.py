"""Real failure texts, each from a public thread or AWS's documentation (cited next to it), read by the one
rule table (jobs.retry.classify.RULES) and answered by the retry policy (jobs.retry.policy).

Where SageMaker shows a script's error inside a FailureReason, the text is wrapped as it arrives there
("AlgorithmError: " + the last error line); the words after the wrapper are the thread's own.
"""

from __future__ import annotations

import pytest

from contract.failures import OUT_OF_MEMORY_ADVICE
from jobs.request.parse import parse_request
from jobs.retry import run_state as runs
from jobs.retry.classify import Category, Response, classify_api_error, classify_description
from jobs.retry.policy import Action, decide_next

C = Category
GH = "https://github.com/"


def reason(text: str, status: str = "Failed", secondary: str = "Failed") -> dict:
    return {"TrainingJobName": "mltrain-run-1234abcd-a1", "TrainingJobStatus": status, "SecondaryStatus": secondary,
            "FailureReason": text}


def status_message(text: str) -> dict:
    """A job whose only word is a secondary-status message (no FailureReason yet)."""
    return {"TrainingJobName": "mltrain-run-1234abcd-a1", "TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
            "SecondaryStatusTransitions": [{"Status": "Starting", "StatusMessage": text}]}


# (source, job description, category, action)
JOB_FAILURES = [
    (GH + "DIAGNijmegen/rse-grand-challenge/issues/2631", reason(
        "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML "
        "instance type."), C.CAPACITY, Response.RETRY),
    (GH + "aws/sagemaker-pytorch-training-toolkit/pull/171", reason(
        "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML "
        "instance type."), C.CAPACITY, Response.RETRY),
    (GH + "aws/amazon-sagemaker-feedback/issues/99", reason(
        "EC2InsufficientCapacityError: Instance type 'ml.g5.48xlarge' is temporarily unavailable in supported "
        "availability zones [euw1-az1]. Try again in a few minutes, or try a different instance type."),
     C.CAPACITY, Response.RETRY),
    (GH + "aws/sagemaker-python-sdk/issues/70", reason(
        "InternalServerError: We encountered an internal error. Please try again."), C.INTERNAL, Response.RETRY),
    (GH + "aws/sagemaker-spark/issues/76", reason(
        "InternalServerError: We encountered an internal error. Please try again."), C.INTERNAL, Response.RETRY),
    # Hardware: SageMaker's own status message (docs/REFERENCE.md), then CUDA's and NCCL's words.
    ("docs/REFERENCE.md (SageMaker status message)", status_message(
        "Launched instance was unhealthy, replacing it!"), C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "DIAGNijmegen/rse-grand-challenge/issues/2836", reason(
        "AlgorithmError: RuntimeError: CUDA error: uncorrectable ECC error encountered"), C.HARDWARE,
     Response.RETRY_CHECKED),
    (GH + "vllm-project/vllm/issues/5222", reason(
        "AlgorithmError: ExecuteUserScriptError: RuntimeError: CUDA error: uncorrectable ECC error encountered"),
     C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "huggingface/accelerate/issues/1192", reason(
        "AlgorithmError: RuntimeError: CUDA error: uncorrectable ECC error encountered CUDA kernel errors might be "
        "asynchronously reported at some other API call,so the stacktrace below might be incorrect."),
     C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "NVIDIA/semantic-segmentation/issues/33", reason(
        "AlgorithmError: RuntimeError: cuda runtime error (39) : uncorrectable ECC error encountered at "
        "/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:265"), C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "nagadit/DeepFaceLab_Linux/issues/89", reason(
        "AlgorithmError: failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC "
        "error encountered"), C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "kohya-ss/sd-scripts/issues/1434", reason(
        "AlgorithmError: [Rank 1] NCCL watchdog thread terminated with exception: CUDA error: uncorrectable ECC "
        "error encountered"), C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "jade-hpc-gpu/jade-hpc-gpu.github.io/issues/194", reason(
        "AlgorithmError: RuntimeError: CUDA error: uncorrectable ECC error encountered"), C.HARDWARE,
     Response.RETRY_CHECKED),
    (GH + "hiyouga/LlamaFactory/issues/2341", reason(
        "AlgorithmError: RuntimeError: CUDA error: uncorrectable ECC error encountered"), C.HARDWARE,
     Response.RETRY_CHECKED),
    (GH + "verl-project/verl/issues/726", reason(
        "AlgorithmError: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5 "
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error."),
     C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "aws/aws-ofi-nccl/issues/161", reason(
        "AlgorithmError: NCCL WARN NET/OFI Request completed with error. RC: 21. Error: unknown error"),
     C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "awslabs/awsome-distributed-ai/issues/386", reason(
        "AlgorithmError: nccl_net_ofi_create_plugin:1067 NCCL WARN NET/OFI aws-ofi-nccl initialization failed"),
     C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "aws/deep-learning-containers/issues/2675", reason(
        "AlgorithmError: NCCL WARN NET/OFI Only EFA provider is supported"), C.HARDWARE, Response.RETRY_CHECKED),
    # cuDNN failing inside the library, beside ECC errors on SageMaker: the GPU (retried on a checked instance).
    (GH + "NVIDIA/apex/issues/610", reason(
        "AlgorithmError: RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "pytorch/pytorch/issues/5962", reason(
        "AlgorithmError: RuntimeError: CUDNN_STATUS_INTERNAL_ERROR"), C.HARDWARE, Response.RETRY_CHECKED),
    # A collective that never completed (torch's NCCL watchdog): a rank stopped, as the package's hang line says.
    (GH + "NVIDIA/Megatron-LM/issues/1207", reason(
        "AlgorithmError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out."),
     C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "pytorch/pytorch/issues/118369", reason(
        "AlgorithmError: NCCL watchdog thread terminated with exception: [Rank 7] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25624887 "
        "milliseconds before timing out."), C.HARDWARE, Response.RETRY_CHECKED),
    (GH + "hiyouga/LlamaFactory/issues/7396", reason(
        "AlgorithmError: ExecuteUserScriptError: [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
        "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."),
     C.HARDWARE, Response.RETRY_CHECKED),
    # No route to S3 from the job's subnets: the platform's network, though SageMaker says ClientError. Retried as a
    # service fault (bounded); the reason says what the platform team checks.
    (GH + "aws/amazon-sagemaker-operator-for-k8s/pull/22", reason(
        "ClientError: Artifact upload failed:Please ensure that the subnet's route table has a route to an S3 VPC "
        "endpoint or a NAT device, and both the security groups and the subnet's network ACL allow outbound traffic "
        "to S3"), C.INTERNAL, Response.RETRY),
    ("issue 18 (the same message when SageMaker downloads the input channels)", reason(
        "ClientError: Data download failed:Please ensure that the subnet's route table has a route to an S3 VPC "
        "endpoint or a NAT device, both the security groups and the subnet's network ACL allow outbound traffic to "
        "S3."), C.INTERNAL, Response.RETRY),
    # The user's code or data.
    (GH + "aws-samples/generative-ai-on-amazon-sagemaker/pull/242", reason(
        "ClientError: Data download failed:Failed to download data. S3 key: s3://amazon-sagemaker-506250256483-"
        "us-east-1-46bx6qaqethoyv/shared//train/input/code/requirements.txt has an illegal char sub-sequence '//' "
        "in it"), C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/4384", reason(
        "ClientError: Data download failed:Unable to download object s3://sagemaker-repository-dub/model-data-"
        "model-package_llama2-7b-v3-740347e540da35b4ab9f6fc0ab3fed2c (AccessDenied: Access Denied)"),
     C.USER_ERROR, Response.RETRY),
    (GH + "aws-samples/sagemaker-run-notebook/issues/32", reason(
        "ClientError: Failed to download data. ListObjectsV2 failed for s3://aws-emr-resources/dataAccess/"
        "papermill_input/ nextToken:[null]: Unable to execute request to S3"), C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/1224", reason(
        "AlgorithmError: framework error: Traceback (most recent call last): File \"/usr/local/lib/python3.6/"
        "dist-packages/sagemaker_containers/_trainer.py\", line 76, in train"), C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/3444", reason(
        "AlgorithmError: ExecuteUserScriptError: Command \"/opt/conda/bin/python3.6 /run_pytorch_training.py "
        "--batch_size 768 --checkpoint_all_hosts False\""), C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/1234", reason("AlgorithmError: Exit Code: 1"), C.USER_ERROR,
     Response.RETRY),
    (GH + "aws/sagemaker-python-sdk/issues/134", reason("AlgorithmError: Exit Code: 139"), C.USER_ERROR,
     Response.RETRY),
    (GH + "rapidsai/deployment/issues/523", reason(
        "AlgorithmError: xgboost.core.XGBoostError: Memory allocation error on worker 0: std::bad_alloc: "
        "out_of_memory: CUDA error at: /opt/conda/include/rmm/mr/device/cuda_memory_resource.hpp"),
     C.USER_ERROR, Response.RETRY),
    (GH + "huggingface/trl/issues/1169", reason(
        "AlgorithmError: torch.cuda.OutOfMemoryError: Caught OutOfMemoryError in replica 0 on device 0."),
     C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/842", reason(
        "AlgorithmError: Exit Code: 132"), C.USER_ERROR, Response.RETRY),
]

# (source, Catch Error, Catch Cause, category, action)
API_FAILURES = [
    (GH + "gabehollombe-aws/jupyter-notebooks/issues/1", "SageMaker.ResourceLimitExceededException",
     "The account-level service limit 'ml.p3.2xlarge for training job usage' is 0 Instances, with current "
     "utilization of 0 Instances and a request delta of 1 Instances. Please contact AWS support to request an "
     "increase for this limit.", C.QUOTA, Response.FAIL),
    (GH + "aws-john/SageMakerRL-SML-Summit-2019/pull/1", "SageMaker.ResourceLimitExceededException",
     "The account-level service limit 'ml.p3.8xlarge for training job usage' is 0 Instances, with current "
     "utilization of 0 Instances and a request delta of 1 Instances.", C.QUOTA, Response.FAIL),
    (GH + "zenml-io/zenml/issues/847", "SageMaker.ResourceLimitExceededException",
     "The account-level service limit 'ml.p2.xlarge\nfor training job usage' is 0 Instances, with current "
     "utilization of 0 Instances and a request delta of 1 Instances.", C.QUOTA, Response.FAIL),
    (GH + "aws/sagemaker-python-sdk/issues/35", "SageMaker.ResourceLimitExceededException",
     "The account-level service limit for training-job/ml.p2.xlarge is 0 Instances, with current utilization of "
     "0 Instances and a request delta of 2 Instances.", C.QUOTA, Response.FAIL),
    (GH + "aws/amazon-sagemaker-examples/issues/1001", "SageMaker.ResourceLimitExceededException",
     "The requested resource training-job/ml.p2.xlarge is not available in this region", C.QUOTA, Response.FAIL),
    (GH + "data-science-on-aws/data-science-on-aws/issues/200", "SageMaker.ResourceLimitExceededException",
     "The account-level service limit 'Number of instances across all processing jobs' is 4 Instances, with "
     "current utilization of 0 Instances and a request delta of 11 Instances.", C.QUOTA, Response.FAIL),
    (GH + "data-science-on-aws/data-science-on-aws/issues/140", "SageMaker.ResourceLimitExceededException",
     "An error occurred (ResourceLimitExceeded) when calling the CreateTrainingJob operation: The account-level "
     "service limit 'Number of instances across all processing jobs' is 4 Instances, with current utilization of "
     "0 Instances and a request delta of 11 Instances.", C.QUOTA, Response.FAIL),
    # Within the limit once other jobs end: worth the wait.
    (GH + "aws/amazon-sagemaker-examples/issues/1543", "SageMaker.ResourceLimitExceededException",
     "The account-level service limit 'ml.p3.8xlarge for training job usage' is 2 Instances, with current "
     "utilization of 3 Instances and a request delta of 1 Instances.", C.QUOTA, Response.RETRY),
    (GH + "aws/sagemaker-python-sdk/issues/645", "SageMaker.AmazonSageMakerException",
     "An error occurred (ThrottlingException) when calling the CreateTrainingJob operation (reached max "
     "retries: 4): Rate exceeded", C.THROTTLING, Response.RETRY),
    (GH + "aws/deep-learning-containers/pull/1018", "SageMaker.AmazonSageMakerException",
     "botocore.exceptions.ClientError: An error occurred (ThrottlingException) when calling the "
     "CreateTrainingJob operation (reached max retries: 4): Rate exceeded", C.THROTTLING, Response.RETRY),
    (GH + "datahub-project/datahub/issues/6357", "SageMaker.AmazonSageMakerException",
     "ClientError: An error occurred (ThrottlingException) when calling the DescribeProcessingJob operation "
     "(reached max retries: 4): Rate exceeded", C.THROTTLING, Response.RETRY),
    (GH + "boto/boto3/issues/2847", "SageMaker.AmazonSageMakerException",
     "botocore.exceptions.ClientError: An error occurred (500) when calling the CreateTrainingJob operation "
     "(reached max retries: 4): Internal Server Error", C.INTERNAL, Response.RETRY),
    ("https://docs.aws.amazon.com/autoscaling/ec2/APIReference/CommonErrors.html", "SageMaker.AmazonSageMakerException",
     "The request processing has failed because of an unknown error, exception or failure. (Service: "
     "AmazonSageMaker; Status Code: 500; Error Code: InternalFailure; Request ID: 1; Proxy: null)",
     C.INTERNAL, Response.RETRY),
    ("https://docs.aws.amazon.com/autoscaling/ec2/APIReference/CommonErrors.html", "SageMaker.AmazonSageMakerException",
     "The request has failed due to a temporary failure of the server. (Service: AmazonSageMaker; Status Code: "
     "503; Error Code: ServiceUnavailable; Request ID: 1; Proxy: null)", C.INTERNAL, Response.RETRY),
    ("https://docs.aws.amazon.com/emr/latest/APIReference/CommonErrors.html", "SageMaker.AmazonSageMakerException",
     "ServiceUnavailable: The request has failed due to a temporary failure of the server.", C.INTERNAL,
     Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/2489", "SageMaker.AmazonSageMakerException",
     "An error occurred (ValidationException) when calling the CreateTrainingJob operation: No S3 objects found "
     "under S3 URL \"s3://sagemaker-glue-example-521695447989-us-west-2/output/train\" given in input data source.",
     C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/2267", "SageMaker.AmazonSageMakerException",
     "An error occurred (ValidationException) when calling the CreateTrainingJob operation: No S3 objects found "
     "under S3 URL \"s3://sagemaker-us-west-2-521695447989/image-classification/train/\" given in input data "
     "source.", C.USER_ERROR, Response.RETRY),
    (GH + "Kenza-AI/sagify/issues/111", "SageMaker.AmazonSageMakerException",
     "An error occurred (ValidationException) when calling the CreateTrainingJob operation: Invalid "
     "MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true",
     C.USER_ERROR, Response.RETRY),
    (GH + "aws/amazon-sagemaker-examples/issues/869", "SageMaker.AmazonSageMakerException",
     "ClientError: An error occurred (ValidationException) when calling the CreateHyperParameterTuningJob "
     "operation: Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true",
     C.USER_ERROR, Response.RETRY),
]


def test_there_are_at_least_forty_cited_texts():
    assert len(JOB_FAILURES) + len(API_FAILURES) >= 40
    assert all(source for source, *_ in JOB_FAILURES + API_FAILURES)


@pytest.mark.parametrize(("source", "description", "category", "action"), JOB_FAILURES,
                         ids=[f"{i}-{(s.split('/') + ['', '', ''])[3]}" for i, (s, *_) in enumerate(JOB_FAILURES)])
def test_job_failures(source, description, category, action):
    failure = classify_description(description)
    assert (failure.category, failure.action) == (category, action), source


@pytest.mark.parametrize(("source", "error", "cause", "category", "action"), API_FAILURES,
                         ids=[f"{i}-{(s.split('/') + ['', '', ''])[3]}" for i, (s, *_) in enumerate(API_FAILURES)])
def test_api_failures(source, error, cause, category, action):
    failure = classify_api_error(error, cause)
    assert (failure.category, failure.action) == (category, action), source


def test_an_impossible_quota_fails_at_once_saying_what_to_raise():
    failure = classify_api_error(*API_FAILURES[5][1:3])
    assert "raise the quota to at least 11" in failure.reason
    assert "Service Quotas" in classify_api_error(*API_FAILURES[0][1:3]).reason


@pytest.mark.parametrize(("line", "words"), [
    ("AlgorithmError: [training:non_finite] loss was NaN for 3 steps in a row at step 812; lower lr",
     "non_finite: loss was NaN"),
    ("AlgorithmError: [training:out_of_memory] CUDA out of memory at micro_batch_size=16",
     "lower hyperparameters.micro_batch_size"),
    # The package's verdict outranks words that look like hardware or capacity.
    ("AlgorithmError: [training:config_invalid] backend=nccl but NCCL error: no GPU; use gloo",
     "config_invalid: backend=nccl"),
])
def test_the_training_packages_own_lines_are_the_users_with_the_message(line, words):
    failure = classify_description(reason(line))
    assert failure.category is C.USER_ERROR and failure.action is Response.FAIL
    assert words in failure.reason


@pytest.mark.parametrize("line", [
    # The package's own line carries the advice: the reason says it once.
    f"AlgorithmError: [training:out_of_memory] CUDA out of memory on rank 0 in step 3: {OUT_OF_MEMORY_ADVICE}",
    # A peer's report of it does not: the reason adds it.
    "AlgorithmError: [training:out_of_memory] rank 1 on host host-1 failed and ended the run: CUDA out of memory",
])
def test_the_out_of_memory_advice_reaches_the_user_once(line):
    assert classify_description(reason(line)).reason.count(OUT_OF_MEMORY_ADVICE) == 1


def test_the_hang_line_is_a_fault_retried_on_a_checked_instance_naming_the_rank():
    line = ("AlgorithmError: [training:hang] rank 1 on host algo-2 stopped progressing after step 812 (the other "
            "ranks wait for it inside a collective): no step completed in 301 s")
    failure = classify_description(reason(line))
    assert (failure.category, failure.action) == (C.HARDWARE, Response.RETRY_CHECKED)
    assert "rank 1 on host algo-2" in failure.reason and "hang" in failure.reason


def test_no_route_to_s3_names_the_platforms_network():
    failure = classify_description(next(d for source, d, *_ in JOB_FAILURES if source.startswith("issue 18")))
    assert "platform's network" in failure.reason and "S3 gateway endpoint" in failure.reason


def _run(platform, request):
    from jobs.render.training_job import render_create_training_job

    req = parse_request(request)
    run = runs.new_run(req, run_id="gpt-1234abcd", execution={"name": "e"}, now=0.0)
    return req, run, lambda attempt, **kw: runs.start_attempt(
        run, render_create_training_job(req, platform, run_id="gpt-1234abcd", attempt=attempt, **kw),
        attempt=attempt, now=0.0)


def test_hardware_faults_retry_on_the_next_type_with_infra_check_then_give_up(platform):
    req, run, start = _run(platform, {"name": "gpt", "dataset": "s3://b-1/x/", "retry": {"hardware_max_retries": 2},
                                      "instance": {"type": "ml.p4d.24xlarge", "fallbacks": ["ml.p4de.24xlarge"]}})
    start(1)
    fault = classify_description(status_message("Launched instance was unhealthy, replacing it!"))
    decisions = []
    for attempt in (1, 2, 3):
        runs.finish_attempt(run, now=0.0, job=None, failure=fault)
        decision = decide_next(req, run, fault, 0.0)
        decisions.append(decision)
        if decision.action is Action.RETRY:
            start(attempt + 1, instance_type=decision.instance_type, infra_check=decision.infra_check)
    assert [d.action for d in decisions] == [Action.RETRY, Action.RETRY, Action.FAIL]
    assert [d.instance_type for d in decisions[:2]] == ["ml.p4de.24xlarge", "ml.p4d.24xlarge"]
    assert all(d.infra_check for d in decisions[:2])
    assert "hardware faults persisted" in decisions[2].reason


def test_a_hang_is_retried_with_infra_check(platform):
    req, run, start = _run(platform, {"name": "gpt", "dataset": "s3://b-1/x/", "instance": {"type": "ml.p4d.24xlarge"}})
    start(1)
    failure = classify_description(reason("AlgorithmError: [training:hang] rank 3 on host algo-1 stopped progressing"))
    runs.finish_attempt(run, now=0.0, job=None, failure=failure)
    decision = decide_next(req, run, failure, 0.0)
    assert decision.action is Action.RETRY and decision.infra_check and "rank 3 on host algo-1" in decision.reason


def test_an_impossible_quota_is_not_retried(platform):
    req, run, start = _run(platform, {"name": "gpt", "dataset": "s3://b-1/x/", "instance": {"type": "ml.p4d.24xlarge"}})
    start(1)
    failure = classify_api_error(*API_FAILURES[0][1:3])
    runs.finish_attempt(run, now=0.0, job=None, failure=failure)
    decision = decide_next(req, run, failure, 0.0)
    assert decision.action is Action.FAIL and "Service Quotas" in decision.reason
