"""The planner: sizes a job request's run (memory, time, cost, checkpoint cadence) over candidate layouts.

    shape      what the model is: parameters, FLOPs, bytes per sample (presets or `model_shape`)
    layout     strategy and degrees; the numerics the request's hyperparameters set
    memory     bytes per GPU          timing     seconds per step        cadence   checkpoints, interruptions
    candidates one sized layout        plan       the recommendation      warnings  what to look out for
    auto       what `strategy: auto` may run, and its pick (the renderer sends the pick's degrees)
    input_check  can the loader feed the GPUs: the format's measured load rate x the vCPUs, against their need
"""

from jobs.planning.plan import PlanResult, plan_request
from jobs.planning.shape import PlanInputError

__all__ = ["PlanInputError", "PlanResult", "plan_request"]
