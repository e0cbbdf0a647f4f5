"""The job model: request schema and validation, instance catalog, CreateTrainingJob rendering,
failure classification, the retry policy and the launcher's Lambda handlers.

Standard library only (boto3 is imported lazily inside the handlers' AWS calls): this folder is
the launcher Lambda's whole code, shipped with no bundled dependencies. It imports nothing else of
the project.
"""
