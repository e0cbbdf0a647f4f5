"""Where a retry is decided: why an attempt failed (classify), what happens next (policy), the run state carried between attempts, and whether an ended run may resume."""
