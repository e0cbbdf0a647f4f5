"""`trainctl`: the engineers' command line for the training platform (plan, render, submit, watch, local)."""
