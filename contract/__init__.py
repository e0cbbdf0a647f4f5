"""The facts two rooms share, defined once (standard library only).

Shipped inside the launcher's Lambda asset (with `jobs`) and the training source dir (with `training`):
  - schema:          the one schema engine (dataclasses -> parser, text forms, JSON Schema, reference tables)
  - errors:          Problem (a field path and a message) and the errors that carry them
  - hyperparameters: every hyperparameter the training package accepts, the strategies
  - models:          the reference models' presets (names and shapes)
  - metrics:         metric names, the `[metrics]` log line, its regex, the CloudWatch namespace
  - container:       SageMaker container paths and variables, status file, stop grace, log group
  - gpus:            each GPU's peak dense tensor-core FLOP/s (the planner's and the MFU metric's)
"""
