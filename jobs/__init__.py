"""The job model: request schema and validation, instance catalog, CreateTrainingJob rendering,
failure classification, the retry policy and the launcher's Lambda handlers.

Standard library only (boto3 is imported lazily inside the handlers' AWS calls): this folder and
`contract/` (the facts shared with the training package, shipped alongside) are the launcher Lambda's
whole code, with no bundled dependencies. It imports nothing else of the project.

    request          parse_request, validate_for_platform, request_json_schema (the entry points)
    request_schema   JobRequest and its sections        request_fields   field-level rules
    request_rules    cross-field rules                   platform_rules   rules of a deployed platform
    api_limits       CreateTrainingJob's limits          hyperparameter_rules  who sets which hyperparameter
    command_line     what may reach the toolkit's shell  environment_rules  variables, credentials, secrets
    platform         PlatformSettings, TrainingPlan      catalog, planner, images
    render           CreateTrainingJob requests          classify         the failure rule table
    policy           retry or fail                       run, summary     the run state, its summary
    handler          the Lambda handlers                 reference        README's reference tables
"""
