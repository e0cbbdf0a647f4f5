"""Repository tools that are not part of `trainctl`: `make demo` (tools.demo) and `make synth`'s deploy summary
(tools.deploy_summary)."""
