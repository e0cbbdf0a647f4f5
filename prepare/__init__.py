"""Data preparers: turn what a team has into the channel formats the training package reads. Run on a
workstation, never imported by a training job (so tokenizers and pyarrow live here, not in training/):
`python -m prepare.corpus` (Python's standard library as byte tokens: a corpus to try the platform with),
`python -m prepare.text` (JSONL or Parquet text through a tokenizer.json into token shards) and
`python -m prepare.images` (an ImageFolder tree into WebDataset-layout tar shards).
"""
