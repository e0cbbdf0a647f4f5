"""How a model is spread over the ranks: the process group and this rank's place in it (`process_group.py`),
the device mesh and its degrees (`mesh.py`), one module per strategy (`strategies/`), pipeline parallelism's stage
cutting and schedules (`pipeline_parallel.py`; the input pipeline is training.data), and the gradient norm over
mixed DTensors (`grad_norm.py`).
"""
