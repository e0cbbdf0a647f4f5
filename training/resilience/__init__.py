"""How a run survives and ends: the loop's per-step progress marks (`heartbeat.py`), the hang watchdog that
watches them (`watchdog.py`), the per-rank step timing that names stragglers (`stragglers.py`), what a rank says
when its peers are gone (`peers.py`), the stop flag a SIGTERM or the stop file raises (`stop.py`), and the run's
outcome: the status file, the failure line, `Result` (`outcome.py`).
"""
