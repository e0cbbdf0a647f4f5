"""`python -m cli` runs trainctl (the same app as the `trainctl` console script)."""

from cli.main import app

app(prog_name="trainctl")
