"""The training package: runs inside SageMaker's PyTorch containers, under `trainctl local`, and in tests.

It speaks only the SageMaker container contract (SM_* variables, /opt/ml paths, hyperparameters as
`--key value` arguments) and imports nothing of the rest of the project and nothing of AWS.
"""
