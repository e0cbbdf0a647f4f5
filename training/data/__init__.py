"""The input pipeline (not the pipeline-parallel schedule: training.parallel.pipeline_parallel): what a
channel holds and how it is read (`datasets.py`: token and .npy image shards, synthetic data; `tar_shards.py`:
WebDataset-layout tar shards of encoded images), which samples each rank reads and where a resume picks up
(`sampler.py`), and how batches reach the step ahead of it (`loader.py`: DataLoader workers, `data_wait_s`).
"""
