"""The job model: request schema and validation, instance catalog, CreateTrainingJob rendering,
failure classification, the retry policy and the launcher's Lambda handlers.

Standard library only (boto3 is imported lazily inside the handlers' AWS calls): this folder and
`contract/` (the facts shared with the training package, shipped alongside) are the launcher Lambda's
whole code, with no bundled dependencies. It imports nothing else of the project.

Its folders form layers, each importing only those below it (docs/ARCHITECTURE.md, "Inside jobs/"):

    handler, reference   the Lambda handlers; README's reference tables
    outcome/             the summary and the run record
    render/, retry/      the CreateTrainingJob of attempt N; failure rules, retry policy, run state, resume
    request/             parse, schema and the rules (field, cross, hyperparameter, environment, image, command line,
                         platform), CreateTrainingJob's limits, the state size guard
    planning/            the planner (`strategy: auto`)
    prices, platform     the Price List API's answer; PlatformSettings, TrainingPlan
    timestamps, naming, catalog, registry
                         timestamps; run ids, job names and tags; instance types; the run registry
"""
