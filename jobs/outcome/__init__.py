"""What a run ends with: the summary and notification, and the run's record (goodput, cost)."""
