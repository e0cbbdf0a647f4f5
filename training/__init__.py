"""The training package: runs inside SageMaker's PyTorch containers, under `trainctl local`, and in tests.

It speaks only the SageMaker container contract (SM_* variables, /opt/ml paths, hyperparameters as
`--key value` arguments). Of the rest of the project it imports only `contract` (standard library, shipped
beside it in the source dir), and nothing of AWS.
"""
