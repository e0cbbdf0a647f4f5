"""What a run reports: a log interval's loss, step time, throughput and honest MFU, the non-finite watch and
where the attempt's time went (`meter.py`), the FLOPs the MFU counts (`flops.py`), and the `[metrics]` lines,
metrics.jsonl and each GPU's peak (`logger.py`).
"""
