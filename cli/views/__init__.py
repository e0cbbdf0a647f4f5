"""How trainctl prints things for people: executions, the plan, charts, live progress."""
